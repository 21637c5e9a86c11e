"""engine: openai behind the router: requests reach an endpoint proxray does not host unchanged (tools,
response_format, streaming chunk by chunk, usage), with its key and none of the client's headers; a 429, a 500 or a
dropped connection before the first token falls back to the next model; the key is in no log. The endpoint is a
stand-in hosted API on 127.0.0.1 (tests/openai_standin.py), driven through the openai client over HTTP."""
import os
import secrets
import zlib
from pathlib import Path

import pytest

from openai_standin import MODEL, StandIn

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
    key = "sk-" + secrets.token_hex(16)
    old = os.umask(0o077)
    (tmp / "api_key").write_text(key + "\n")
    os.umask(old)
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


def test_a_routed_stream_is_relayed_chunk_by_chunk_with_its_usage(client, app):
    text = prompt_of(5, "How many apples does Ava have now?")
    chunks = list(client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": text}],
                                                 stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert pieces == ["The", " answer", " is", " 42."]
    assert chunks[0].model == EXTERNAL and chunks[0].model_extra["proxray"]["routed"] is True
    assert chunks[-1].usage.completion_tokens == 4


@pytest.mark.parametrize("kind,what", [(0, "429"), (1, "500"), (2, "dropped connection")])
def test_a_failure_before_the_first_token_falls_back(client, app, kind, what):
    text = prompt_of(kind, f"Which planet is known as the Red Planet? ({what})")
    r = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": text}])
    report = r.model_extra["proxray"]
    assert r.model == WEAK and report["fallback_from"] == [EXTERNAL], report
    again = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": text}])
    assert again.model == EXTERNAL  # its second try answers


def test_the_key_is_in_no_log(app, client):
    _, _, key = app
    import ray

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"  # this test's own Ray
    assert logs.is_dir()
    leaked = [p.name for p in logs.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert leaked == []
