"""The endpoint as a faithful OpenAI gateway, on a real local Ray Serve over HTTP on 127.0.0.1, with the
clients users point at it unchanged: the openai SDK, LangChain's ChatOpenAI and LiteLLM. The requests the
model deployments received are read back from them (``seen``), so passthrough is asserted on what the
model saw. CPU engines here (a tiny transformers model and sim models); tests/test_vllm_serve.py does the
same against vLLM. Marked slow (Serve start-up), run by CI all the same; traffic is bounded."""
import json
import os
import time

import httpx
import pytest

import serve_helpers
from serve_helpers import BROKEN, KEY, SLOW, STRONG, WEAK, start_app, stop_app

pytestmark = pytest.mark.slow
TINY = "tiny-llama-b"
MIDFAIL = SLOW  # a sim model that fails after its first word when streaming
LONG = "Qwen/Qwen2-7B-Instruct"  # a sim model that streams a word every 0.5 s
APP = "proxray-gw"
FOLDERS = {}
# the router's view: BROKEN best (so routed requests exercise fallback), TINY good and cheap
PROFILE = {TINY: (0.8, 1e-6), BROKEN: (1.0, 2e-6), LONG: (0.1, 5e-5)}  # LONG: poor and dear, routed last
CONVERSATION = [{"role": "system", "content": "You answer in one word."},
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": [{"type": "text", "text": "Another one,"}, {"type": "text", "text": "please."}]}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, encoder):
    from proxray.devtools import build_tiny_model

    os.environ["PROXRAY_TEST_KEY"] = KEY
    tmp = tmp_path_factory.mktemp("gateway")
    one = {"min_replicas": 1, "max_replicas": 1}
    FOLDERS[TINY] = build_tiny_model(tmp / TINY, seed=1)
    models = [{"id": TINY, "engine": "transformers", "source": FOLDERS[TINY], "autoscaling": one},
              {"id": WEAK, "engine": "sim", "autoscaling": one},
              {"id": STRONG, "engine": "sim", "autoscaling": one},
              {"id": BROKEN, "engine": "sim", "engine_kwargs": {"fail_always": True}, "autoscaling": one},
              {"id": MIDFAIL, "engine": "sim", "engine_kwargs": {"fail_mid_stream": True}, "autoscaling": one},
              {"id": LONG, "engine": "sim", "engine_kwargs": {"word_latency_s": 0.5}, "autoscaling": one}]
    from proxray.serve.tenancy.keys import new_key_entry

    FOLDERS["team-key"] = new_key_entry(tmp / "keys.yaml", "team")  # a key of the keys file: its metrics
    yield start_app(tmp, encoder, models, api_key_env="PROXRAY_TEST_KEY", timeout_s=60, max_body_bytes=64 * 1024,
                    default_max_tokens=16, app_name=APP, profile=PROFILE, router_num_cpus=0.2,
                    keys_file=str(tmp / "keys.yaml"),
                    metrics_port=serve_helpers.free_port())  # a Ray of its own: its metrics are this app's alone
    stop_app()


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=60)


def seen(model):
    return serve_helpers.seen(model, APP)


def post(server, body, path="/v1/chat/completions", raw=None, headers=None):
    h = {"Authorization": f"Bearer {KEY}", "content-type": "application/json", **(headers or {})}
    return httpx.post(f"{server}{path}", content=raw if raw is not None else json.dumps(body), headers=h, timeout=60)


# ---- passthrough ----------------------------------------------------------------------------------
def test_openai_sdk_multi_turn_reaches_the_model_as_sent(client):
    r = client.chat.completions.create(model=TINY, messages=CONVERSATION, max_completion_tokens=5, seed=7,
                                       temperature=0.0, top_p=0.9, user="u-1")
    got = seen(TINY)
    assert got["endpoint"] == "/chat/completions"
    assert got["body"]["messages"] == CONVERSATION  # every role, content parts kept as parts
    assert got["body"]["model"] == TINY and got["body"]["max_completion_tokens"] == 5 and "max_tokens" not in got["body"]
    assert got["body"]["seed"] == 7 and got["body"]["top_p"] == 0.9 and got["body"]["user"] == "u-1"
    assert "proxray" not in got["body"]
    # the tiny random model rarely stops by itself: cut at the limit, and it says so
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    # the transformers engine's chat template ran over the whole conversation
    from transformers import AutoTokenizer

    from proxray.serve.protocols.chat import ChatRequest

    tok = AutoTokenizer.from_pretrained(FOLDERS[TINY])
    msgs = [{"role": m.role, "content": m.text()} for m in ChatRequest(model=TINY, messages=CONVERSATION).messages]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert r.usage.prompt_tokens == len(tok(text, add_special_tokens=False)["input_ids"])


def test_routed_request_passes_through_with_only_the_model_rewritten(client):
    r = client.chat.completions.create(model="proxray", messages=CONVERSATION, max_tokens=4, stop=["zz"], n=2,
                                       extra_body={"proxray": {"allowed_models": [TINY, WEAK], "lam": 0.0}})
    assert r.model == TINY and len(r.choices) == 2 and [c.index for c in r.choices] == [0, 1]
    body = seen(TINY)["body"]
    assert body == {"model": TINY, "messages": CONVERSATION, "max_tokens": 4, "stop": ["zz"], "n": 2}
    assert r.usage.completion_tokens == sum(1 for _ in r.choices) * 4


def test_stop_cuts_the_answer_and_reports_stop(client):
    kw = dict(model=WEAK, messages=[{"role": "user", "content": "Why is the sky blue?"}])
    full = client.chat.completions.create(**kw).choices[0].message.content
    assert "answer" in full
    cut = client.chat.completions.create(stop=["answer"], **kw).choices[0]
    assert cut.message.content == full[:full.index("answer")] and cut.finish_reason == "stop"
    short = client.chat.completions.create(max_tokens=2, **kw).choices[0]
    assert short.finish_reason == "length" and len(short.message.content.split()) == 2


def test_stream_is_the_models_chunks_with_usage(client):
    kw = dict(model="proxray", messages=CONVERSATION, max_tokens=6, seed=3,
              extra_body={"proxray": {"allowed_models": [TINY]}})
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].model_extra["proxray"]["model"] == TINY
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6  # the usage chunk
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert seen(TINY)["body"]["stream_options"] == {"include_usage": True}


def test_completions_pass_through(client):
    r = client.completions.create(model=TINY, prompt="Once upon a time", max_tokens=3, echo=False)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    assert {k: v for k, v in seen(TINY).items() if k != "at"} == {
        "endpoint": "/completions", "body": {"model": TINY, "prompt": "Once upon a time", "max_tokens": 3, "echo": False}}


@pytest.mark.parametrize("extra,name", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ({"frobnicate": 1}, "frobnicate"),
])
def test_what_a_cpu_engine_cannot_honour_is_refused_by_name(client, extra, name):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=TINY, messages=CONVERSATION, max_tokens=2, extra_body=extra)
    assert name in e.value.message and e.value.body["param"] == name


def test_routing_leaves_out_models_that_cannot_honour_the_request(client):
    import openai

    with pytest.raises(openai.BadRequestError) as e:  # every routable model here is a CPU engine
        client.chat.completions.create(model="proxray", messages=CONVERSATION, logprobs=True,
                                       extra_body={"proxray": {"allowed_models": [TINY, WEAK]}})
    assert "no routable model honours: logprobs" in e.value.message and e.value.body["param"] == "logprobs"


# ---- streaming failures ---------------------------------------------------------------------------
def test_stream_falls_back_before_its_first_chunk(client):
    chunks = list(client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": "Hi there"}],
                                                 stream=True, extra_body={"proxray": {"allowed_models": [BROKEN, WEAK]}}))
    rep = chunks[0].model_extra["proxray"]
    assert rep["fallback_from"] == [BROKEN] and rep["model"] == WEAK and {c.model for c in chunks} == {WEAK}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_failure_mid_stream_ends_with_an_error_event(server):
    body = {"model": MIDFAIL, "messages": [{"role": "user", "content": "Tell me a story"}], "stream": True}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    assert events[0]["choices"][0]["delta"]["content"]  # the first word came through
    assert "error" in events[-1] and "mid-stream" in events[-1]["error"]["message"]
    assert "/" not in events[-1]["error"]["message"].replace("google/gemma", "")  # no paths
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200


# ---- other clients --------------------------------------------------------------------------------
def test_a_client_that_goes_away_stops_the_generation(client):
    """The client reads the first words of a long stream and hangs up: the model's generation is cancelled
    there, not run on for nobody (its answer has 17 words, one every 0.5 s)."""
    prompt = "Write a long story about a lighthouse keeper and the sea."
    stream = client.chat.completions.create(model=LONG, messages=[{"role": "user", "content": prompt}], stream=True)
    words = [c.choices[0].delta.content for c, _ in zip(stream, range(2))]
    stream.close()  # the connection goes
    assert words[0] == "[Qwen/Qwen2-7B-Instruct,"
    deadline = time.time() + 60  # wait on the deployment's state
    while (last := serve_helpers.ends(LONG, APP)[-1])["ended"] == "running" and time.time() < deadline:
        time.sleep(0.2)
    assert last["ended"] == "cancelled" and 2 <= last["objects"] < 10, last


def test_langchain_chat_openai(server):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="proxray", base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=60,
                     max_completion_tokens=4, stream_usage=True,
                     extra_body={"proxray": {"allowed_models": [TINY]}})
    msgs = [SystemMessage("You answer in one word."), HumanMessage("Name a colour."), AIMessage("Blue."),
            HumanMessage("Another one, please.")]
    out = llm.invoke(msgs)
    assert out.response_metadata["model_name"] == TINY and out.response_metadata["finish_reason"] == "length"
    assert out.usage_metadata["output_tokens"] == 4
    assert [m["role"] for m in seen(TINY)["body"]["messages"]] == ["system", "user", "assistant", "user"]
    streamed = list(llm.stream(msgs))
    assert "".join(c.content for c in streamed) == out.content
    assert sum((c.usage_metadata or {}).get("output_tokens", 0) for c in streamed) == 4
    assert seen(TINY)["body"]["stream_options"] == {"include_usage": True}
    # content parts, n, stop reach the model; tools are refused by name by an engine that cannot call them
    parts = [HumanMessage(content=[{"type": "text", "text": "Name"}, {"type": "text", "text": "a colour."}])]
    r = llm.bind(stop=["zz"]).invoke(parts)
    body = seen(TINY)["body"]
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Name"}, {"type": "text", "text": "a colour."}]}]
    assert body["stop"] == ["zz"] and r.response_metadata["finish_reason"] == "length"
    gens = ChatOpenAI(model=TINY, base_url=f"{server}/v1", api_key=KEY, max_retries=0, n=2, max_tokens=2).generate([msgs])
    assert len(gens.generations[0]) == 2 and seen(TINY)["body"]["n"] == 2
    import openai

    with pytest.raises(openai.BadRequestError, match="tools"):
        llm.bind_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]).invoke(msgs)


def test_litellm_openai_provider(server):
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no fetch of the price list at import
    import litellm

    kw = dict(model="openai/proxray", api_base=f"{server}/v1", api_key=KEY, messages=CONVERSATION, max_tokens=3,
              extra_body={"proxray": {"allowed_models": [TINY]}}, num_retries=0, timeout=60)
    r = litellm.completion(**kw)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    assert seen(TINY)["body"]["messages"] == CONVERSATION
    parts = list(litellm.completion(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == r.choices[0].message.content
    assert seen(TINY)["body"]["stream_options"] == {"include_usage": True}
    two = litellm.completion(**{**kw, "n": 2, "stop": ["zz"], "max_tokens": None, "max_completion_tokens": 2})
    body = seen(TINY)["body"]
    assert len(two.choices) == 2 and body["n"] == 2 and body["stop"] == ["zz"] and body["max_completion_tokens"] == 2
    with pytest.raises(litellm.BadRequestError, match="response_format"):
        litellm.completion(**kw, response_format={"type": "json_object"})


# ---- bounded work ----------------------------------------------------------------------------------
@pytest.mark.parametrize("raw,status,fragment", [
    (json.dumps({"model": WEAK, "messages": [{"role": "user", "content": "x" * 70_000}]}).encode(), 413, "over 65536 bytes"),
    (json.dumps({"model": WEAK, "messages": [{"role": "user", "content": "hi"}] * 513}).encode(), 400, "at most 512"),
    (b'{"model": "proxray", "messages": [{"role": "user", "content": "hi"}], "seed": ' + b"9" * 5000 + b"}", 400, "not valid JSON"),
    (b'{"model": "proxray", "messages": [{"role": "user", "content": "hi"}], "seed": ' + b"9" * 30 + b"}", 400, "64 bits"),
    (b'{"model": "proxray", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 413, "bytes"),
    (b'{"model": "proxray", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "nested deeper"),
    (b'{"model": "proxray", "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"1": ' + b"[" * 40 + b"]" * 40 + b"}}", 400, "nested deeper"),
    (json.dumps({"model": "proxray", "messages": [{"role": "user", "content": [{"type": "text"}]}]}).encode(), 400, "needs a 'text'"),
])
def test_bad_input_is_a_named_4xx_and_the_server_stays_healthy(server, raw, status, fragment):
    r = post(server, None, raw=raw)
    assert r.status_code == status, r.text
    assert fragment in r.json()["error"]["message"]
    assert "Traceback" not in r.text and "/tmp" not in r.text
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200


def test_a_declared_oversized_body_is_refused_before_it_is_read(server):
    """Content-Length over the limit: 413 at once, without waiting for (or reading) the body."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(server)
    with socket.create_connection((u.hostname, u.port), timeout=30) as sock:
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}\r\nAuthorization: Bearer {KEY}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: 9999999\r\n\r\n{{\"model\": ".encode())
        head = sock.recv(65536).decode(errors="replace")  # answered though 9,999,989 bytes never come
    assert head.startswith("HTTP/1.1 413"), head[:200]


def test_docs_and_cors_are_off_by_default(server):
    assert httpx.get(f"{server}/docs", timeout=10).status_code == 404
    assert httpx.get(f"{server}/openapi.json", timeout=10).status_code == 404
    r = post(server, {"model": WEAK, "messages": [{"role": "user", "content": "hi"}]}, headers={"Origin": "http://localhost:5173"})
    assert r.status_code == 200 and not [h for h in r.headers if h.startswith("access-control-")]
    pre = httpx.options(f"{server}/v1/chat/completions", timeout=10,
                        headers={"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 405 and "access-control-allow-origin" not in pre.headers


# ---- metrics ----------------------------------------------------------------------------------------
def test_metrics_reach_rays_prometheus_endpoint(client):
    import ray

    client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": "What is 2+2?"}],
                                   extra_body={"proxray": {"allowed_models": [BROKEN, WEAK]}})  # one fallback
    from openai import OpenAI

    team = OpenAI(base_url=str(client.base_url), api_key=FOLDERS["team-key"], max_retries=0, timeout=60)
    answer = team.chat.completions.create(model="proxray", messages=[{"role": "user", "content": "What is 3+3?"}])
    deadline = time.monotonic() + 30
    while True:  # the answer is remembered after it is sent: wait on the book's state
        fb = httpx.post(f"{str(client.base_url).rstrip('/')}/feedback", json={"id": answer.id, "score": 0.75},
                        headers={"Authorization": f"Bearer {FOLDERS['team-key']}"}, timeout=30)
        # 503: a shared actor (the keys ledger, the answer book) slower than its 2-s call timeout on a loaded machine,
        # which says to retry shortly, as a client does
        if fb.status_code not in (404, 503) or time.monotonic() > deadline:
            break
        time.sleep(0.05 if fb.status_code == 404 else 0.5)
    assert fb.status_code == 200 and fb.json()["model"] == answer.model
    port = ray.nodes()[0]["MetricsExportPort"]
    want = ["ray_proxray_routing_decisions", "ray_proxray_routing_latency_ms_bucket", "ray_proxray_fallbacks",
            "ray_proxray_outlier_score_bucket", "ray_proxray_request_errors", "ray_proxray_key_requests",
            "ray_proxray_key_spend_usd", "ray_proxray_feedback", "ray_proxray_feedback_score_sum"]
    deadline, text = time.time() + 90, ""
    while time.time() < deadline:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        if all(w in text for w in want):
            break
        time.sleep(0.5)
    missing = [w for w in want if w not in text]
    assert not missing, f"not exported: {missing}"
    line = next(x for x in text.splitlines() if x.startswith("ray_proxray_fallbacks") and BROKEN in x)
    assert float(line.rsplit(" ", 1)[1]) >= 1
    line = next(x for x in text.splitlines() if x.startswith("ray_proxray_feedback_score_sum") and answer.model in x)
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(0.75)
    # every gateway series the shipped Grafana dashboard charts is one Ray exports (the drift monitor's, exported by
    # its application: tests/test_monitor_app.py)
    import re

    from conftest import ROOT

    dash = json.loads((ROOT / "dashboards" / "proxray_grafana.json").read_text())
    charted = {n for p in dash["panels"] for t in p["targets"] for n in re.findall(r"ray_proxray_\w+", t["expr"])
               if not n.startswith("ray_proxray_monitor_")}
    assert charted and not [n for n in charted if n not in text]
