"""engine: openai behind the router: requests reach an endpoint proxray does not host unchanged (tools,
response_format, streaming chunk by chunk, usage), with its key and none of the client's headers; a 429, a 500 or a
dropped connection before the first byte is retried (Retry-After honoured) and costs no request; an endpoint that
keeps failing falls back to the next model; one that refuses the gateway's key takes its model out of routing (a named
request gets a 502 naming the model, never the endpoint's 401, URL or key fragment); the key is in no log. The
endpoint is a stand-in hosted API on 127.0.0.1 (tests/openai_standin.py), driven through the openai client over
HTTP."""
import json
import zlib
from pathlib import Path

import pytest

from openai_standin import MODEL, StandIn, key_file

pytestmark = pytest.mark.slow

WEAK, EXTERNAL = "meta-llama/Llama-3.2-1B-Instruct", "frontier"
PROFILE = {EXTERNAL: (0.95, 1e-7), WEAK: (0.2, 2e-7)}  # the router prefers the endpoint's model


def prompt_of(kind: int, stem: str) -> str:
    """A prompt the stand-in answers with fault ``kind`` on its first try (0: 429, 1: 500, 2: dropped, 5: none)."""
    for i in range(1000):
        text = f"{stem} (case {i})"
        if zlib.crc32(text.encode()) % 6 == kind:
            return text
    raise AssertionError


@pytest.fixture(scope="module")
def app(tmp_path_factory, encoder):
    from serve_helpers import start_app, stop_app

    tmp = tmp_path_factory.mktemp("endpoint")
    key, _ = key_file(tmp)
    standin = StandIn(key)
    models = [{"id": EXTERNAL, "engine": "openai", "source": MODEL, "base_url": standin.url,
               "api_key_file": str(tmp / "api_key"), "price": {"input_per_mtok": 2.0, "output_per_mtok": 8.0},
               "rate_limit": {"requests_per_minute": 6000}},
              {"id": WEAK, "engine": "sim"}]
    url = start_app(tmp, encoder, models, profile=PROFILE)
    yield url, standin, key
    stop_app()
    standin.stop()


@pytest.fixture(scope="module")
def client(app):
    from openai import OpenAI

    return OpenAI(base_url=f"{app[0]}/v1", api_key="unused", max_retries=0, timeout=60)


def test_a_pass_through_request_reaches_the_endpoint_as_sent(client, app):
    _, standin, key = app
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "number"}}}}}]
    text = prompt_of(5, "What is 6 times 7?")
    before = len(standin.requests)
    r = client.chat.completions.create(model=EXTERNAL, messages=[{"role": "user", "content": text}], tools=tools,
                                       response_format={"type": "json_object"}, temperature=0.3, max_tokens=20,
                                       extra_headers={"X-Client-Secret": "do-not-forward"})
    assert r.model == EXTERNAL and r.choices[0].message.content == "The answer is 42."
    assert r.usage.completion_tokens == 5 and r.model_extra["proxray"]["routed"] is False
    headers, body = standin.requests[before]
    assert body["tools"] == tools and body["response_format"] == {"type": "json_object"}
    assert body["model"] == MODEL and body["temperature"] == 0.3 and body["max_tokens"] == 20
    assert headers["Authorization"] == f"Bearer {key}"
    assert not any(k.lower() == "x-client-secret" or "do-not-forward" in str(v) for k, v in headers.items())


def test_a_hint_reaches_a_model_that_takes_it_and_is_named_where_it_is_left_out(client, app):
    """A provider's hints (prompt cache key, metadata, storage, safety identifier): sent on as they are to the endpoint,
    whose API takes them; left out of what the simulated model is sent (it takes none of them) and named in its answer —
    the report's ``dropped`` and the header — whole, streamed, named and routed; never a 400. The prompt cache key
    names a routed request's conversation."""
    _, standin, _ = app
    hints = {"prompt_cache_key": "session-7", "metadata": {"team": "a"}, "store": True, "safety_identifier": "u-7"}
    ask = {"messages": [{"role": "user", "content": prompt_of(5, "Name a colour.")}], "max_tokens": 8}
    before = len(standin.requests)
    raw = client.chat.completions.with_raw_response.create(model=EXTERNAL, **ask, extra_body=hints)
    assert "x-proxray-dropped" not in raw.headers and "dropped" not in raw.parse().model_extra["proxray"]
    assert {k: standin.requests[before][1].get(k) for k in hints} == hints
    raw = client.chat.completions.with_raw_response.create(model=WEAK, **ask, extra_body=hints)
    assert raw.headers["x-proxray-dropped"] == ",".join(sorted(hints))
    assert raw.parse().model == WEAK and raw.parse().model_extra["proxray"]["dropped"] == sorted(hints)
    chunks = list(client.chat.completions.create(model=WEAK, **ask, stream=True, extra_body=hints))
    assert chunks[0].model_extra["proxray"]["dropped"] == sorted(hints)
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    routed = client.chat.completions.create(model="proxray", **ask,
                                            extra_body={**hints, "proxray": {"allowed_models": [WEAK]}})
    assert routed.model == WEAK and routed.model_extra["proxray"]["dropped"] == sorted(hints)
    # the prompt cache key names the conversation: its next turn continues it on its model
    assert routed.model_extra["proxray"]["conversation"]["id"] == "session-7"
    again = client.chat.completions.create(model="proxray", **ask,
                                           extra_body={**hints, "proxray": {"allowed_models": [WEAK]}})
    told = again.model_extra["proxray"]["conversation"]
    assert told["id"] == "session-7" and told["previous"] == WEAK and told["action"] == "kept"
    plain = client.chat.completions.create(model=WEAK, **ask)  # a request without hints names nothing
    assert "dropped" not in plain.model_extra["proxray"]


def test_a_routed_stream_is_relayed_chunk_by_chunk_with_its_usage(client, app):
    text = prompt_of(5, "How many apples does Ava have now?")
    chunks = list(client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": text}],
                                                 stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert pieces == ["The", " answer", " is", " 42."]
    assert chunks[0].model == EXTERNAL and chunks[0].model_extra["proxray"]["routed"] is True
    assert chunks[-1].usage.completion_tokens == 4


def test_faults_before_the_first_byte_are_retried_and_cost_no_request(client, app):
    """Half the stand-in's prompts fail on their first try (a 429 with Retry-After, a 500, a dropped connection):
    routed, named and streamed requests alike are answered by the endpoint's model, each fault retried once."""
    _, standin, _ = app
    texts = [prompt_of(kind, f"Which planet is known as the Red Planet? ({i})") for i in range(4) for kind in (0, 1, 2, 5)]
    answered = []
    for i, text in enumerate(texts):
        model = "proxray" if i % 2 else EXTERNAL
        if i % 4 == 3:
            chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                                         stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "The answer is 42."
            answered.append((chunks[0].model, chunks[0].model_extra["proxray"]["fallback_from"]))
        else:
            r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
            answered.append((r.model, r.model_extra["proxray"]["fallback_from"]))
    assert answered == [(EXTERNAL, [])] * len(texts)
    tries = {t: sum(p == t for _, p, _ in standin.log) for t in texts}
    assert tries == {t: 2 if zlib.crc32(t.encode()) % 6 in (0, 1, 2) else 1 for t in texts}


def test_an_endpoint_that_keeps_failing_falls_back_after_its_retries(client, app):
    _, standin, _ = app
    text = "Which planet is known as the Red Planet? [down]"
    r = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": text}])
    report = r.model_extra["proxray"]
    assert r.model == WEAK and report["fallback_from"] == [EXTERNAL], report
    assert sum(p == text for _, p, _ in standin.log) == 1 + 4  # max_retries
    assert "127.0.0.1" not in json.dumps(report) and "/v1" not in json.dumps(report)


def test_the_key_is_in_no_log(app, client):
    _, _, key = app
    import ray

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"  # this test's own Ray
    assert logs.is_dir()
    leaked = [p.name for p in logs.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert leaked == []


def test_what_the_request_provokes_goes_to_its_client_once_and_takes_no_model_out(client, app):
    """A body that provokes the endpoint's 404 about an item it refers to, or its 400, is the client's: answered at
    once, the endpoint asked once (never retried), and the next key's plain request to the model is answered — the
    model stays in routing. An answer whose connection breaks after its 200 is a 502, not generated a second time."""
    import openai

    _, standin, _ = app
    for marker, error in (("[missing-item]", openai.NotFoundError), ("[refuse]", openai.BadRequestError)):
        text = f"Which planet is known as the Red Planet? {marker}"
        with pytest.raises(error) as e:
            client.chat.completions.create(model=EXTERNAL, messages=[{"role": "user", "content": text}])
        assert f"model '{EXTERNAL}': its endpoint answered" in str(e.value.body)
        assert sum(p == text for _, p, _ in standin.log) == 1  # asked once
        r = client.chat.completions.create(model=EXTERNAL, messages=[{"role": "user", "content": "What is 2+2?"}])
        assert r.model == EXTERNAL and r.choices[0].message.content == "The answer is 42."  # still in routing
    text = "Which planet is known as the Red Planet? [break]"
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=EXTERNAL, messages=[{"role": "user", "content": text}])
    assert e.value.status_code == 502 and "broke off" in str(e.value.body)
    assert sum(p == text for _, p, _ in standin.log) == 1  # generated once: the operator pays once


def test_an_endpoint_that_refuses_the_gateways_key_is_taken_out_and_named(client, app):
    """The endpoint revokes the gateway's key: a named request gets a 502 naming the model (not the endpoint's 401,
    which would tell the client its own key is wrong), routed requests try it last while the model is out, and
    no URL, host or key fragment reaches the client. (Last in the module: the model stays out for its cool-down.)"""
    import openai

    _, standin, key = app
    standin.revoke()
    try:
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model=EXTERNAL, messages=[{"role": "user", "content": prompt_of(5, "Hi")}])
        body = json.dumps(e.value.body)
        assert e.value.status_code == 502 and f"model '{EXTERNAL}': its endpoint refused the gateway's key" in body
        for secret in ("127.0.0.1", "/v1", key[:5], key[-4:], "Incorrect API key"):
            assert secret not in body, secret
        asked = len(standin.requests)
        r = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": "What is 2+2?"}])
        report = r.model_extra["proxray"]
        # out of routing: tried last for its cool-down (the router's first choice), so another answers first
        assert r.model == WEAK and report["fallback_from"] == [] and report["estimates"][EXTERNAL]
        assert len(standin.requests) == asked  # not asked again during its cool-down
        assert "127.0.0.1" not in json.dumps(report) and key[-4:] not in json.dumps(report)
    finally:
        standin.restore()
