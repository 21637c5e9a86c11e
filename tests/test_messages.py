"""Anthropic's Messages API on a running app (127.0.0.1), driven by the anthropic SDK as Claude Code and agent
frameworks drive it: create and stream (its accumulator), a tool loop (tool_use -> tool_result -> answer) kept on one
model through a Claude Code session, errors as the SDK's exception types, x-api-key and Bearer keys with their budget
charged at each answer's usage, model aliases, count_tokens, what Claude Code sends beside the API (thinking, betas,
context management), routing on the user's ask behind an agent harness's system prompt, and many requests at once.
Bounded in count and time; waits on state."""
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serve_helpers import STRONG, WEAK, kill_under_load, ledger, start_app, stop_app

pytestmark = pytest.mark.slow

MID = "google/gemma-7b-it"
PRICES = {WEAK: {"input_per_mtok": 0.1, "output_per_mtok": 0.2}, STRONG: {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
          MID: {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}
KEYS: dict = {}
HARNESS = ("You are an interactive CLI tool that helps users with software engineering tasks. " * 120)  # ~10k chars
ASKS = ["What is 17 times 23?", "Write a haiku about autumn leaves.", "Who wrote Pride and Prejudice?",
        "Translate 'good morning' into French.", "What is the derivative of x^3?", "Name three prime numbers."]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                             "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}
SHELL = {"name": "Bash", "description": "Run a command", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


@pytest.fixture(scope="module")
def app(tmp_path_factory, encoder):
    from proxray.serve.tenancy.keys import new_key_entry

    tmp = tmp_path_factory.mktemp("messages")
    one = {"min_replicas": 1, "max_replicas": 1}
    models = [{"id": m, "engine": "sim", "autoscaling": one, "price": PRICES[m]} for m in (WEAK, STRONG, MID)]
    f = tmp / "keys.yaml"
    KEYS["dev"] = new_key_entry(f, "dev", budget={"usd": 10.0})
    KEYS["weak-only"] = new_key_entry(f, "weak-only", allowed_models=[WEAK])
    KEYS["early"] = new_key_entry(f, "leaves-early", budget={"usd": 1e-3, "over_budget": "reject"})
    aliases = {"claude-haiku-*": {"model": WEAK}, "claude-*": {"model": "proxray", "lam": 0.0},
               "claude-opus-4-1": {"model": "proxray", "allowed_models": [STRONG]}}
    url = start_app(tmp, encoder, models, keys_file=str(f), timeout_s=30, request_timeout_s=60,
                    model_aliases=aliases)
    yield url
    stop_app()


def anthropic(app, name="dev", bearer=False):
    from anthropic import Anthropic

    if bearer:  # ANTHROPIC_AUTH_TOKEN, as Claude Code sends it
        return Anthropic(base_url=app, auth_token=KEYS[name], api_key=None, max_retries=0, timeout=60)
    return Anthropic(base_url=app, api_key=KEYS[name], max_retries=0, timeout=60)


def cost(model, usage):
    p = PRICES[model]
    return (usage.input_tokens * p["input_per_mtok"] + usage.output_tokens * p["output_per_mtok"]) / 1e6


def test_create_and_stream_routed_and_named_with_the_budget_charged_at_each_answers_usage(app):
    client = anthropic(app)
    before = ledger("dev")["spent_usd"]
    routed = client.messages.create(model="proxray", max_tokens=32, messages=[{"role": "user", "content": ASKS[0]}])
    assert routed.type == "message" and routed.role == "assistant" and routed.stop_reason in ("end_turn", "max_tokens")
    assert routed.content[0].type == "text" and routed.content[0].text
    assert routed.usage.input_tokens > 0 and routed.usage.output_tokens > 0
    report = routed.model_extra["proxray"]
    assert report["routed"] and report["model"] == routed.model and "outlier_score" in report
    named = client.messages.create(model=MID, max_tokens=32, messages=[{"role": "user", "content": ASKS[1]}])
    assert named.model == MID and not named.model_extra["proxray"]["routed"]
    with client.messages.stream(model=MID, max_tokens=32, messages=[{"role": "user", "content": ASKS[1]}]) as s:
        deltas = [e.delta.text for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert "".join(deltas) == final.content[0].text == named.content[0].text  # the same answer, streamed
    assert final.usage.output_tokens == named.usage.output_tokens and final.usage.input_tokens == named.usage.input_tokens
    spent = ledger("dev")["spent_usd"] - before
    want = cost(routed.model, routed.usage) + 2 * cost(MID, named.usage)
    print(json.dumps({"charged_usd": spent, "usage_priced_usd": want}))
    assert spent == pytest.approx(want, rel=1e-6)  # every Messages answer charged at its usage, streamed or not


def test_a_tool_loop_keeps_its_model_through_a_claude_code_session(app):
    client = anthropic(app, bearer=True)
    session = {"X-Claude-Code-Session-Id": "sess-tool-loop"}
    first = client.messages.create(model="proxray", max_tokens=64, tools=[WEATHER, SHELL], extra_headers=session,
                                   tool_choice={"type": "tool", "name": "get_weather"},
                                   messages=[{"role": "user", "content": "What is the weather in Oslo?"}])
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "get_weather" and set(use.input) == {"city", "unit"} and use.input["unit"] == "c"
    history = [{"role": "user", "content": "What is the weather in Oslo?"},
               {"role": "assistant", "content": [b.model_dump() for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "12 C, rain"}]}]
    models = set()
    for _ in range(3):  # the tool's result goes back to the model that asked for it, whatever the router says now
        after = client.messages.create(model="proxray", max_tokens=32, tools=[WEATHER, SHELL], messages=history,
                                       extra_headers=session, extra_body={"proxray": {"lam": 1e6}})
        assert after.stop_reason in ("end_turn", "max_tokens") and after.content[0].type == "text"
        rep = after.model_extra["proxray"]
        assert rep["conversation"]["tool_loop"] and rep["conversation"]["action"] == "kept"
        models.add(after.model)
    assert models == {first.model}
    # streamed: the tool's arguments as input_json_delta, parsed by the SDK's accumulator
    with client.messages.stream(model=WEAK, max_tokens=64, tools=[SHELL], tool_choice={"type": "any"},
                                messages=[{"role": "user", "content": "List the files"}]) as s:
        kinds = [e.delta.type for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert "input_json_delta" in kinds and final.stop_reason == "tool_use"
    assert final.content[-1].type == "tool_use" and final.content[-1].input == {"command": "example"}


def test_errors_come_as_the_sdks_exception_types(app):
    import anthropic as sdk

    client = anthropic(app)
    ask = [{"role": "user", "content": "hi"}]
    with pytest.raises(sdk.BadRequestError) as e:
        client.messages.create(model="proxray", messages=ask, max_tokens=0)
    assert e.value.body["error"]["type"] == "invalid_request_error" and "max_tokens" in e.value.body["error"]["message"]
    r = httpx.post(f"{app}/v1/messages", headers={"x-api-key": KEYS["dev"]}, json={"model": "proxray", "messages": ask})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]  # required, as Anthropic's
    with pytest.raises(sdk.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=8, messages=ask)
    with pytest.raises(sdk.AuthenticationError) as e:
        sdk.Anthropic(base_url=app, api_key="sk-wrong", max_retries=0).messages.create(model="proxray", max_tokens=8,
                                                                                    messages=ask)
    assert e.value.body == {"type": "error", "error": {"type": "authentication_error", "message": e.value.body[
        "error"]["message"]}} and "sk-wrong" not in e.value.body["error"]["message"]
    with pytest.raises(sdk.PermissionDeniedError):
        anthropic(app, "weak-only").messages.create(model=STRONG, max_tokens=8, messages=ask)
    r = httpx.post(f"{app}/v1/messages", headers={"x-api-key": KEYS["dev"]}, content=b"{not json")
    assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"


def test_what_claude_code_sends_is_accepted(app):
    """The fields and headers of Claude Code's request (print mode), on a model that answers through chat."""
    body = {"model": "claude-sonnet-4-5-20250929", "max_tokens": 32000, "stream": True,
            "system": [{"type": "text", "text": HARNESS, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is 2 + 2?"}]}],
            "tools": [SHELL, WEATHER], "thinking": {"type": "adaptive"}, "metadata": {"user_id": json.dumps(
                {"device_id": "d", "session_id": "sess-cc"})}, "context_management": {"edits": []},
            "output_config": {"effort": "high"}, "temperature": 1}
    headers = {"Authorization": f"Bearer {KEYS['dev']}", "anthropic-version": "2023-06-01",
               "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
               "X-Claude-Code-Session-Id": "sess-cc"}
    events = []
    with httpx.stream("POST", f"{app}/v1/messages?beta=true", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("event: "):
                events.append(line[7:])
            elif line.startswith("data: ") and events[-1] == "message_start":
                start = json.loads(line[6:])
    assert events[:2] == ["message_start", "ping"] and events[-2:] == ["message_delta", "message_stop"]
    assert "content_block_delta" in events
    report = start["message"]["proxray"]
    assert report["routed"] and report["conversation"]["id"] == "sess-cc"
    assert set(report["dropped"]) >= {"thinking", "context_management", "output_config", "metadata"}


def test_aliases_map_client_model_ids_with_a_stated_precedence(app):
    client = anthropic(app)
    ask = [{"role": "user", "content": ASKS[2]}]
    assert client.messages.create(model="claude-haiku-4-5", max_tokens=8, messages=ask).model == WEAK
    opus = client.messages.create(model="claude-opus-4-1", max_tokens=8, messages=ask)  # exact before any glob
    assert opus.model == STRONG and opus.model_extra["proxray"]["routed"]
    sonnet = client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=ask)
    assert sonnet.model_extra["proxray"]["lam_from"] == "alias" and sonnet.model_extra["proxray"]["lam"] == 0.0
    mine = client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=ask,
                                  extra_body={"proxray": {"lam": 5.0}})
    assert mine.model_extra["proxray"]["lam_from"] == "request"  # the request's own, before the alias's
    from openai import OpenAI

    chat = OpenAI(base_url=f"{app}/v1", api_key=KEYS["dev"], max_retries=0).chat.completions.create(
        model="claude-haiku-4-5", messages=ask)  # the same aliases for every API
    assert chat.model == WEAK


def test_count_tokens_for_the_routed_and_the_named_model(app):
    client = anthropic(app)
    ask = [{"role": "user", "content": ASKS[3] * 10}]
    named = client.messages.count_tokens(model=MID, messages=ask)
    routed = client.messages.count_tokens(model="proxray", messages=ask, system="Be brief.")
    assert named.input_tokens > 10 and routed.input_tokens > named.input_tokens
    assert named.model_extra["proxray"] == {"model": MID, "estimated": True}


def test_different_asks_behind_one_harness_route_as_they_do_without_it(app):
    """The routing text is the user's ask: an agent's long system prompt neither changes the route nor meets
    max_prompt_chars (32,000)."""
    client = anthropic(app)
    bare, behind = [], []
    for ask in ASKS:
        for out, system in ((bare, None), (behind, HARNESS * 4)):  # ~40k characters of harness
            kw = {"system": system} if system else {}
            r = client.messages.create(model="proxray", max_tokens=8, messages=[{"role": "user", "content": ask}],
                                       extra_body={"proxray": {"explain": True}}, **kw)
            rep = r.model_extra["proxray"]
            out.append((rep["model"], round(rep["outlier_score"], 6)))
    print(json.dumps({"bare": bare, "behind_harness": behind}))
    assert behind == bare and len({s for _, s in bare}) == len(ASKS)  # six asks, six scores, as without it


def test_many_messages_at_once(app):
    client = anthropic(app)

    def one(i):
        return client.messages.create(model="proxray", max_tokens=16,
                                      messages=[{"role": "user", "content": f"{ASKS[i % 6]} ({i})"}])

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(32)))
    assert all(a.content and a.usage.output_tokens > 0 for a in answers)


@pytest.mark.parametrize("actor", ["proxray-keys-proxray", "proxray-conversations-proxray"])
def test_a_shared_actor_killed_under_a_sessions_load_costs_no_500(app, actor):
    """Claude Code sessions under load while the keys ledger (fails closed: a 529 with Retry-After, briefly) or the
    conversations book (fails open: the turn is routed as a first one) is killed."""
    import threading

    stop, seen = threading.Event(), []

    def load(n):
        body = {"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": ASKS[n]}]}
        headers = {"x-api-key": KEYS["dev"], "X-Claude-Code-Session-Id": f"sess-load-{n}"}
        with httpx.Client(base_url=app, timeout=60) as http:
            while not stop.is_set():
                r = http.post("/v1/messages", json=body, headers=headers)
                seen.append((time.monotonic(), r.status_code, r.json()))

    threads = [threading.Thread(target=load, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    try:
        killed = kill_under_load(actor, seen, lambda s: len(s) >= 12, lambda e: e[1] == 200, 2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    after = [(t - killed, s, body) for t, s, body in seen if t > killed]
    bad = [(round(t, 2), s, b) for t, s, b in after if s not in (200, 529)]
    assert not bad, bad[:5]
    assert all(b["type"] == "error" and b["error"]["type"] == "overloaded_error" for _, s, b in after if s == 529)
    assert any(s == 200 and t > 0.5 for t, s, _ in after)
    print(json.dumps({"actor": actor, "after_kill": len(after), "529": sum(s == 529 for _, s, _ in after)}))


def test_a_recorded_claude_code_request_and_its_tool_loop_replayed(app):
    """A request Claude Code 2.1.328 sent in print mode (tests/data/claude_code_request.json: its 50 kB body — a
    7,000-character system prompt, twelve tools, adaptive thinking, context management, a system turn after the
    user's, a <system-reminder> block before the ask — and its headers, the key aside), replayed with a key of the
    keys file; then the loop it starts: the model's tool call, its result back, the answer — on one model."""
    from conftest import ROOT

    rec = json.loads((ROOT / "tests" / "data" / "claude_code_request.json").read_text())
    body, session = rec["body"], rec["headers"]["x-claude-code-session-id"]
    headers = {**rec["headers"], "Authorization": f"Bearer {KEYS['dev']}"}

    def events(b):
        with httpx.stream("POST", f"{app}{rec['path']}", json=b, headers=headers, timeout=60) as r:
            assert r.status_code == 200, r.read()
            data = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        return data[0]["message"]["proxray"], data

    report, data = events(body)
    assert report["routed"] and report["conversation"]["id"] == session and data[-1]["type"] == "message_stop"
    assert {"thinking", "context_management", "output_config", "metadata"} <= set(report["dropped"])
    bare = anthropic(app).messages.create(model="proxray", max_tokens=8, messages=[
        {"role": "user", "content": "What is 2 + 2?"}]).model_extra["proxray"]
    assert report["outlier_score"] == pytest.approx(bare["outlier_score"], abs=1e-6)  # routed on the ask alone
    call = {"type": "tool_use", "id": "toolu_rec_1", "name": "Bash", "input": {"command": "echo $((2 + 2))"}}
    loop = {**body, "messages": body["messages"] + [
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}, call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_rec_1", "content": "4"},
                                     {"type": "text", "text": "<system-reminder>\nkeep going\n</system-reminder>"}]}]}
    after, data = events(loop)
    assert after["model"] == report["model"] and after["conversation"]["tool_loop"]
    assert after["outlier_score"] == pytest.approx(report["outlier_score"], abs=1e-6)  # the same ask
    assert any(e["type"] == "content_block_delta" for e in data)


def test_messages_streams_left_early_are_charged_their_hold_and_stop_at_the_budget(app):
    """A key that reads the first events of each streamed answer and goes (before message_delta's usage): each answer
    is charged its hold, not 0, and the key is refused once the holds reach its budget."""
    body = {"model": STRONG, "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": ASKS[0]}]}
    served = refused = 0
    for _ in range(8):
        with httpx.stream("POST", f"{app}/v1/messages", json=body, timeout=60,
                          headers={"x-api-key": KEYS["early"]}) as r:
            if r.status_code == 429:
                refused += 1
                r.read()
                assert r.json()["error"]["type"] == "rate_limit_error" and "budget" in r.json()["error"]["message"]
                continue
            assert r.status_code == 200
            served += 1
            for i, _ in enumerate(r.iter_lines()):
                if i >= 2:
                    break  # gone after message_start, before the usage
    spent = ledger("leaves-early")["spent_usd"]
    print(json.dumps({"left_early_served": served, "refused": refused, "spent_usd": spent, "budget_usd": 1e-3}))
    assert 1 <= served <= 3 and refused == 8 - served
    assert spent >= served * 2.5e-4  # each charged its hold (the body and 16 tokens at 15 USD/Mtok), not 0
    assert spent <= 1e-3
