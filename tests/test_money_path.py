"""The money path of every protocol against keys that try, over HTTP on 127.0.0.1 (the CPU demo's simulated models, a
keys file, a stand-in Anthropic endpoint that bills its prompt cache, a hosted tool and a long-context tier, and an
OpenAI-style one that bills service tiers and hosted searches): malformed bodies are 4xx naming the field and leave
the app healthy; a decoy output-limit field is refused, alone and in a burst; count_tokens counts toward the key's
rate and books no output tokens on a rate-limited endpoint; cache writes, cache reads and a hosted tool's calls,
service tiers and the long-context tier are charged as the provider bills them; an upstream 404 or 403 a client's
body provoked takes no model out. Bounded in count and time."""
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import agent_standin
from agent_standin import AgentStandIn
from anthropic_standin import LONG_CONTEXT, MODEL, PRICES, AnthropicStandIn, bill
from openai_standin import key_file
from serve_helpers import STRONG, WEAK, ledger, ray_address, start_app, stop_app

pytestmark = pytest.mark.slow

CLAUDE = "claude-standin"
UNPRICED_TOOLS = "claude-standin-unpriced-tools"
SHARED = "claude-standin-shared-limit"  # the same model behind a token limit of its own, which one test fills
LONG = "claude-standin-1m"  # the same model with its long-context tier priced
TIERED = "hosted/tiered-coder"  # the agent stand-in's chat-coder: billed by service tier and per hosted search
SIM_PRICES = {WEAK: {"input_per_mtok": 0.1, "output_per_mtok": 0.2}, STRONG: {"input_per_mtok": 3.0, "output_per_mtok": 15.0}}
KEYS: dict = {}


@pytest.fixture(scope="module")
def app(tmp_path_factory, encoder):
    from proxray.serve.tenancy.keys import new_key_entry

    tmp = tmp_path_factory.mktemp("money")
    upstream_key, upstream_file = key_file(tmp)
    standin, agent = AnthropicStandIn(upstream_key), AgentStandIn()
    admin = tmp / "admin"
    admin.mkdir()
    KEYS["admin"], admin_file = key_file(admin)
    f = tmp / "keys.yaml"
    KEYS["dev"] = new_key_entry(f, "dev", budget={"usd": 10.0})
    KEYS["other"] = new_key_entry(f, "other", budget={"usd": 10.0})
    KEYS["leaver"] = new_key_entry(f, "leaver", budget={"usd": 10.0})
    KEYS["counter"] = new_key_entry(f, "counter", requests_per_minute=30)
    KEYS["tight"] = new_key_entry(f, "tight", budget={"usd": 2e-4, "over_budget": "reject"})
    KEYS["limited"] = new_key_entry(f, "limited", requests_per_minute=2)
    KEYS["broke"] = new_key_entry(f, "broke", budget={"usd": 1e-12, "over_budget": "reject"})
    KEYS["tiers"] = new_key_entry(f, "tiers", budget={"usd": 10.0})
    one = {"min_replicas": 1, "max_replicas": 1}
    models = [{"id": m, "engine": "sim", "autoscaling": one, "price": SIM_PRICES[m]} for m in (WEAK, STRONG)]
    models.append({"id": CLAUDE, "engine": "openai", "source": MODEL, "base_url": standin.url,
                   "api_key_file": str(upstream_file), "protocols": ["messages"],
                   "rate_limit": {"tokens_per_minute": 20000},
                   "price": {"input_per_mtok": PRICES["input"], "output_per_mtok": PRICES["output"],
                             "tool_call_usd": {"web_search_requests": PRICES["web_search"]}}})
    models.append({**models[-1], "id": UNPRICED_TOOLS, "rate_limit": None,  # the same model, its tools unpriced
                   "price": {"input_per_mtok": PRICES["input"], "output_per_mtok": PRICES["output"]}})
    models.append({**models[-2], "id": SHARED})
    models.append({**models[-3], "id": LONG, "rate_limit": None,  # its 1M-token context's tier, as published
                   "price": {**models[-3]["price"], "long_context": {
                       "above_tokens": LONG_CONTEXT["above_tokens"], "input_multiplier": LONG_CONTEXT["input"],
                       "output_multiplier": LONG_CONTEXT["output"]}}})
    models.append({"id": TIERED, "engine": "openai", "source": "chat-coder", "base_url": agent.url,
                   "api_key_file": str(upstream_file), "protocols": ["chat", "responses"],
                   "price": {"input_per_mtok": agent_standin.PRICES["input"],
                             "output_per_mtok": agent_standin.PRICES["output"],
                             "tool_call_usd": {"web_search_call": agent_standin.PRICES["web_search_call"]}}})
    url = start_app(tmp, encoder, models, keys_file=str(f), api_key_file=str(admin_file), timeout_s=30,
                    budget={"cost_per_query": 1e-4},
                    monitor="proxray-monitor-money",  # reports counted even while no monitor runs
                    profile={CLAUDE: (0.1, 1e-3), UNPRICED_TOOLS: (0.1, 1e-3), SHARED: (0.1, 1e-3), LONG: (0.1, 1e-3),
                             TIERED: (0.1, 1e-3)})
    yield url, standin, agent
    stop_app()
    standin.stop()
    agent.stop()


def post(app, path, body, key="dev", timeout=60, **headers):
    return httpx.post(f"{app[0]}{path}", json=body, headers={"Authorization": f"Bearer {KEYS[key]}", **headers},
                      timeout=timeout)


ASK = [{"role": "user", "content": "What is the capital of France?"}]
MALFORMED = [  # (path, body, the field the 400 names)
    ("/v1/messages", {"model": "proxray", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [1]}]}]}, "messages"),
    ("/v1/messages", {"model": "proxray", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": 5}]}]}, "messages"),
    ("/v1/messages", {"model": "proxray", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": "http://x/y.png"}]}]}, "messages"),
    ("/v1/messages", {"model": "proxray", "max_tokens": 8, "messages": ASK,
                      "metadata": {"user_id": "[" * 5000 + "]" * 5000}}, "metadata"),
    ("/v1/messages/count_tokens", {"model": "proxray", "messages": ASK,
                                   "metadata": {"user_id": "[" * 5000 + "]" * 5000}}, "metadata"),
    ("/v1/messages", {"model": "proxray", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": "not an object"}]}]}, "messages"),
    ("/v1/messages", {"model": "proxray", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text"}]}]}, "messages"),
    ("/v1/messages", {"model": "proxray", "max_tokens": 8, "messages": ASK, "n": "x"}, "n"),
    ("/v1/messages", {"model": "proxray", "max_tokens": 8, "messages": ASK, "best_of": "x"}, "best_of"),
    ("/v1/messages", {"model": "proxray", "max_tokens": "many", "messages": ASK}, "max_tokens"),
    ("/v1/messages", {"model": "proxray", "max_tokens": 8, "messages": ASK, "tool_choice": "auto"}, "tool_choice"),
    ("/v1/messages", {"model": "proxray", "max_tokens": 8, "messages": ASK, "system": [{"type": "text"}]}, "system"),
    ("/v1/responses", {"model": "proxray", "input": "hi", "text": "x"}, "text"),
    ("/v1/responses", {"model": "proxray", "input": "hi", "reasoning": "high"}, "reasoning"),
    ("/v1/responses", {"model": "proxray", "input": [{"role": "user", "content": ["hi"]}]}, "input"),
    ("/v1/responses", {"model": "proxray", "input": [{"role": "user", "content": 5}]}, "input"),
    ("/v1/responses", {"model": "proxray", "input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
     "input"),
    ("/v1/responses", {"model": "proxray", "input": [{"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": {"a": 1}}]}, {"role": "user", "content": "hi"}]}, "input"),
    ("/v1/responses", {"model": "proxray", "input": "hi", "tools": [{"name": "f"}]}, "tools"),
    ("/v1/responses", {"model": "proxray", "input": "hi", "n": "x"}, "n"),
    ("/v1/responses", {"model": "proxray", "input": "hi", "top_logprobs": "many"}, "top_logprobs"),
    ("/v1/chat/completions", {"model": "proxray", "messages": ASK, "n": "x"}, "n"),
    ("/v1/chat/completions", {"model": "proxray", "messages": ASK, "best_of": "x"}, "best_of"),
    ("/v1/chat/completions", {"model": "proxray", "messages": [{"role": "user", "content": [5]}]}, "messages"),
    ("/v1/chat/completions", {"model": "proxray", "messages": ASK, "max_tokens": 5, "max_completion_tokens": 6},
     "max_completion_tokens"),
    ("/v1/completions", {"model": "proxray", "prompt": [{"text": "hi"}]}, "prompt"),
    ("/v1/completions", {"model": "proxray", "prompt": "hi", "n": "x"}, "n"),
    ("/v1/completions", {"model": "proxray", "prompt": "hi", "max_tokens": "many"}, "max_tokens"),
]


def test_every_malformed_body_is_a_4xx_naming_the_field_and_the_app_stays_healthy(app):
    got = []
    for path, body, field in MALFORMED:
        r = post(app, path, body)
        text = json.dumps(r.json())
        got.append((path, field, r.status_code))
        assert 400 <= r.status_code < 500, (path, body, r.status_code, text[:300])
        assert field in text, (path, field, text[:300])
    print(json.dumps({"malformed": len(got), "statuses": sorted({s for _, _, s in got})}))
    assert len(got) >= 20
    assert httpx.get(f"{app[0]}/health", timeout=10).status_code == 200
    ok = post(app, "/v1/chat/completions", {"model": "proxray", "messages": ASK, "max_tokens": 4,
                                            "proxray": {"allowed_models": [WEAK, STRONG]}})
    assert ok.status_code == 200, ok.text


def test_a_decoy_limit_field_is_refused_alone_and_in_a_burst(app):
    decoys = [("/v1/responses", {"model": WEAK, "input": "Write a long story.", "max_output_tokens": 100000,
                                 "max_tokens": 1}, ("max_output_tokens", "max_tokens")),
              ("/v1/messages", {"model": WEAK, "max_tokens": 100000, "max_completion_tokens": 1,
                                "messages": [{"role": "user", "content": "Write a long story."}]},
               ("max_tokens", "max_completion_tokens"))]
    before = ledger("tight")["spent_usd"]
    for path, body, fields in decoys:
        r = post(app, path, body, key="tight")
        assert r.status_code == 400 and all(f in json.dumps(r.json()) for f in fields), r.text
        with ThreadPoolExecutor(16) as pool:
            burst = list(pool.map(lambda _: post(app, path, body, key="tight").status_code, range(16)))
        assert burst == [400] * 16
    assert ledger("tight")["spent_usd"] == before  # nothing admitted, nothing spent
    honest = post(app, "/v1/messages", {"model": WEAK, "max_tokens": 100000, "messages": [
        {"role": "user", "content": "Write a long story."}]}, key="tight")
    assert honest.status_code == 429 and "budget" in honest.text  # its one limit is what it is held for


def test_count_tokens_counts_toward_the_rate_and_books_no_output_on_the_endpoint(app):
    body = {"model": CLAUDE, "max_tokens": 1000000, "messages": ASK}
    statuses = [post(app, "/v1/messages/count_tokens", body, key="counter").status_code for _ in range(100)]
    assert statuses.count(200) == 30 and statuses.count(429) == 70  # the key's 30 requests a minute
    counted = [b for p, _, b in app[1].requests if p.endswith("/count_tokens")]
    assert counted and all("max_tokens" not in b for b in counted)  # nothing to generate, nothing to book
    r = post(app, "/v1/messages", {"model": CLAUDE, "max_tokens": 16, "messages": ASK}, key="other")
    assert r.status_code == 200 and r.json()["model"] == CLAUDE  # the endpoint's token limit is not spent


def charged_since(key, before, expected, rel=1e-6):
    """The key's spend since ``before`` once it reaches ``expected`` within ``rel`` (a settlement can land after the
    answer: a stream left early settles once the gateway has read it to its end), or what it is after 10 s."""
    import time

    for _ in range(100):
        charged = ledger(key)["spent_usd"] - before
        if charged == pytest.approx(expected, rel=rel):
            break
        time.sleep(0.1)
    return charged


def missed(usage: dict) -> dict:
    """``usage`` as a miss of the provider's cache would have been billed: its reads written instead (what a key is
    charged at a hosted provider, whose cache every key shares)."""
    read = usage.get("cache_read_input_tokens", 0)
    return {**usage, "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": usage.get("cache_creation_input_tokens", 0) + read}


def test_cache_writes_reads_and_a_hosted_tools_calls_are_charged_as_billed(app):
    """Create, stream, a stream its client leaves after the first event, create: each charged what the stand-in's
    published prices bill for what it generated, its cache reads as the writes a miss would have been (the cache is
    every key's), never less than the bill (a stream left early is read on to its end for its usage)."""
    standin = app[1]
    system = [{"type": "text", "text": "You are a careful assistant. " * 20, "cache_control": {"type": "ephemeral"}}]
    tools = [{"type": "web_search_20250305", "name": "web_search"}]
    before, n0 = ledger("dev")["spent_usd"], len(standin.billed)
    for how in ("create", "stream", "left early", "create"):  # a cache write, then reads
        body = {"model": CLAUDE, "max_tokens": 16, "system": system, "tools": tools, "messages": ASK,
                "stream": how != "create"}
        if how == "create":
            r = post(app, "/v1/messages", body)
            assert r.status_code == 200, r.text
            continue
        with httpx.stream("POST", f"{app[0]}/v1/messages", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {KEYS['dev']}"}) as s:
            events = []
            for line in s.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if how == "left early":
                        break  # gone after message_start, before any usage of its output
        assert events[0]["type"] == "message_start"
    billed = sum(bill(u) for u in standin.billed[n0:])
    as_missed = sum(bill(missed(u)) for u in standin.billed[n0:])
    assert len(standin.billed) - n0 == 4
    charged = charged_since("dev", before, as_missed, rel=0.01)
    print(json.dumps({"charged_usd": charged, "billed_usd": billed, "as_missed_usd": as_missed}))
    assert charged == pytest.approx(as_missed, rel=0.01) and charged >= billed
    assert billed > 4 * bill({"input_tokens": 60, "output_tokens": 4})  # the cache and the tool are most of it
    # what the operator reads: the key's cached share, from the running app's ledger
    import os
    import subprocess
    import sys

    shown = subprocess.run([sys.executable, "-m", "proxray", "keys", "report", "--app", "proxray", "--address",
                            ray_address()],  # this test's Ray, not another on the machine
                           capture_output=True, text=True, timeout=120, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert shown.returncode == 0, shown.stderr[-2000:]
    dev = json.loads(shown.stdout)["dev"]
    cached = sum(u.get("cache_read_input_tokens", 0) for u in standin.billed[n0:])
    assert dev["cached_tokens"] >= cached > 0 and 0 < dev["cached_share"] < 1


def test_a_hosted_tool_without_a_price_is_refused_for_a_budgeted_key(app):
    tools = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]
    r = post(app, "/v1/messages", {"model": UNPRICED_TOOLS, "max_tokens": 8, "tools": tools, "messages": ASK})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert "tools[0]" in r.json()["error"]["message"] and "tool_call_usd" in r.json()["error"]["message"]
    assert post(app, "/v1/messages", {"model": CLAUDE, "max_tokens": 8, "tools": tools, "messages": ASK}).status_code == 200


@pytest.mark.parametrize("fault", ["[echo-404]", "[policy-403]"])
def test_an_upstream_refusal_a_client_provoked_takes_no_model_out(app, fault):
    bad = post(app, "/v1/messages", {"model": CLAUDE, "max_tokens": 8, "messages": [
        {"role": "user", "content": f"Tell me about rs_x-model {fault}"}]}, key="dev")
    assert bad.status_code in (403, 404), bad.text
    after = post(app, "/v1/messages", {"model": CLAUDE, "max_tokens": 8, "messages": ASK}, key="other")
    assert after.status_code == 200 and after.json()["model"] == CLAUDE and not after.json()["proxray"]["fallback_from"]


def test_a_request_the_provider_refuses_keeps_none_of_its_limit_from_other_keys(app):
    """An endpoint's token limit (20,000 a minute) is shared by every key. A request whose ``max_tokens: 1000000``
    books the whole of it is refused by the provider (400): its booking is given back, so another key's next five
    requests are answered within 5 s each and charged what the provider billed, not kept waiting for the minute to pass
    (past their own 30-s deadline: a 504, or refused)."""
    import time

    standin = app[1]
    huge = {"model": SHARED, "max_tokens": 1_000_000, "messages": ASK}
    for _ in range(3):
        r = post(app, "/v1/messages", huge, key="admin")  # the app's own key: no budget or rate of its own
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"], r.text
    for _ in range(5):  # each answered at once and charged what the provider billed for it
        before, n0, t0 = ledger("other")["spent_usd"], len(standin.billed), time.monotonic()
        a = post(app, "/v1/messages", {"model": SHARED, "max_tokens": 8, "messages": ASK}, key="other")
        took = time.monotonic() - t0
        assert a.status_code == 200 and took < 5.0, (took, a.text[:300])
        assert a.json()["model"] == SHARED and not a.json()["proxray"]["fallback_from"]
        (usage,) = standin.billed[n0:]
        assert ledger("other")["spent_usd"] - before == pytest.approx(bill(usage), rel=1e-6)


def test_a_huge_token_count_keeps_none_of_the_endpoints_limit_from_other_keys(app):
    """A ~900 KB ``count_tokens`` (what the stand-in counts as ~180,000 tokens, nine minutes of the endpoint's shared
    20,000-a-minute limit) books nothing of it — a count generates nothing, and providers limit counts apart — so
    another key's next five requests to that endpoint are answered at once."""
    import time

    turns = [{"role": ("user", "assistant")[i % 2], "content": "word " * 36_000} for i in range(5)]  # 180 KB each
    huge = {"model": SHARED, "messages": turns}
    r = post(app, "/v1/messages/count_tokens", huge, key="admin")
    assert r.status_code == 200 and r.json()["input_tokens"] > 100_000, r.text[:300]
    for _ in range(5):
        t0 = time.monotonic()
        a = post(app, "/v1/messages", {"model": SHARED, "max_tokens": 8, "messages": ASK}, key="other")
        assert a.status_code == 200 and a.json()["model"] == SHARED and time.monotonic() - t0 < 5.0, a.text[:300]


def counts() -> dict:
    from ray import serve

    return serve.get_deployment_handle("RouterIngress", "proxray").counts.remote().result()


def test_keys_over_their_rate_or_budget_cost_a_parse_and_nothing_else(app):
    """Admission comes first: a request its key may not send is refused before its history, its embedding, its plan,
    the served budget's λ or the monitor's report — on every protocol, streamed or not."""
    routed = {"model": "proxray", "messages": ASK, "max_tokens": 8}
    start = counts()
    assert [post(app, "/v1/chat/completions", routed, key="limited").status_code for _ in range(2)] == [200, 200]
    before = counts()
    assert before["planned"] >= 2 and before["embedded"] >= 2 and before["monitor_reports"] >= 2
    assert before["measured"] - start["measured"] == 2  # each answered request's body serialised once
    bodies = [("/v1/chat/completions", routed), ("/v1/chat/completions", {**routed, "stream": True}),
              ("/v1/responses", {"model": "proxray", "input": "What is the capital of France?",
                                 "max_output_tokens": 8}),
              ("/v1/messages", {"model": "proxray", "max_tokens": 8, "messages": ASK}),
              ("/v1/completions", {"model": "proxray", "prompt": "The capital of France is", "max_tokens": 8})]
    refused = [post(app, path, body, key=k).status_code for k in ("limited", "broke") for path, body in bodies * 2]
    assert refused == [429] * len(refused)
    after = counts()
    print({"refused": len(refused), "before": before, "after": after})
    # the key with a budget: each body measured once, for the hold its admission asks (the key over its rate: not even)
    assert after.pop("measured") - before.pop("measured") == len(bodies) * 2
    assert after == before  # nothing embedded, planned, reported, nor counted toward the served budget


def test_a_keyed_requests_body_is_serialised_once(app):
    """A key with a budget: its request's body is measured once (its ``TokenBound``) for its admission's hold, the
    hold moved to the chosen model, the charge of an answer without usage and a relayed endpoint's rate limit — routed
    or named, co-hosted or relayed, whole or streamed, on every protocol."""
    bodies = [("/v1/chat/completions", {"model": "proxray", "messages": ASK, "max_tokens": 8}),
              ("/v1/chat/completions", {"model": "proxray", "messages": ASK, "max_tokens": 8, "stream": True}),
              ("/v1/messages", {"model": CLAUDE, "max_tokens": 8, "messages": ASK}),
              ("/v1/messages", {"model": CLAUDE, "max_tokens": 8, "messages": ASK, "stream": True}),
              ("/v1/responses", {"model": "proxray", "input": "What is the capital of France?",
                                 "max_output_tokens": 8}),
              ("/v1/completions", {"model": WEAK, "prompt": "The capital of France is", "max_tokens": 8})]
    before = counts()["measured"]
    assert [post(app, path, body).status_code for path, body in bodies] == [200] * len(bodies)
    assert counts()["measured"] - before == len(bodies)


def test_a_key_is_not_shown_cache_reads_of_a_hosted_providers_shared_cache(app):
    """One key writes a prefix to the hosted provider's prompt cache; another key sending the same prefix is billed a
    cache read by the provider (the gateway has one account there) — it is charged what was billed, but its answer's
    usage shows those tokens as plain input, whole and streamed, and the writer's shows its write as plain input too:
    a hit and a miss look the same, so no key learns what another sent."""
    standin = app[1]
    system = [{"type": "text", "text": "A prefix only the key dev wrote to the cache. " * 20,
               "cache_control": {"type": "ephemeral"}}]
    body = {"model": CLAUDE, "max_tokens": 8, "system": system, "messages": ASK}
    n0 = len(standin.billed)
    first = post(app, "/v1/messages", body, key="dev").json()["usage"]
    assert standin.billed[n0].get("cache_creation_input_tokens", 0) > 0  # the provider wrote it for dev
    other = post(app, "/v1/messages", body, key="other").json()["usage"]
    assert standin.billed[n0 + 1].get("cache_read_input_tokens", 0) > 0  # and read dev's prefix for other
    assert not {"cache_read_input_tokens", "cache_creation_input_tokens", "cache_creation"} & (first.keys() | other.keys())
    assert other == first and other["input_tokens"] >= standin.billed[n0 + 1]["cache_read_input_tokens"]
    with httpx.stream("POST", f"{app[0]}/v1/messages", json={**body, "stream": True}, timeout=60,
                      headers={"Authorization": f"Bearer {KEYS['other']}"}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert not any("cache_read_input_tokens" in json.dumps(e) or "cache_creation" in json.dumps(e) for e in events)


def test_clients_that_leave_whole_answers_are_charged_what_the_endpoint_billed(app):
    """Five clients ask at once for a whole answer the endpoint bills at once and sends 3 s later, and leave after
    1.5 s: the gateway reads each on to its end and charges the key what the stand-in billed (as a stream left early
    is), not 0. (One answer read whole first: the relay's limiter and connections are up, so the five reach the
    endpoint well within the 1.5 s.)"""
    standin = app[1]
    n0 = len(standin.billed)
    ask = [{"role": "user", "content": "[slow] Which number comes after 7?"}]
    assert post(app, "/v1/messages", {"model": CLAUDE, "max_tokens": 16, "messages": ask}, key="leaver").status_code == 200

    def leave(i):
        try:
            post(app, "/v1/messages", {"model": CLAUDE, "max_tokens": 16, "messages": [
                {"role": "user", "content": f"[slow] Which number comes after {i}?"}]}, key="leaver", timeout=1.5)
        except httpx.TimeoutException:
            return "left"
        return "answered"

    with ThreadPoolExecutor(5) as pool:
        assert list(pool.map(leave, range(5))) == ["left"] * 5
    charged = ledger("leaver")["spent_usd"]  # once nothing it holds is unsettled: the answers read to their ends
    billed = sum(bill(u) for u in standin.billed[n0:])
    print(json.dumps({"charged_usd": charged, "billed_usd": billed, "billed": len(standin.billed) - n0}))
    assert len(standin.billed) - n0 == 6 and charged == pytest.approx(billed, rel=0.01)


def test_a_key_is_charged_the_same_for_a_prompt_another_key_cached_and_for_a_fresh_one(app):
    """Key dev writes a prefix S to the hosted provider's cache. Key other sends S (the provider bills it a cache read
    of dev's write) and S', a fresh prefix of the same length (a write): the same usage and the same charge for both,
    so its spend does not tell it that dev sent S. A fresh prefix asked for the one-hour cache is charged what the
    provider bills for it, at the one-hour write price (2x input)."""
    standin = app[1]

    def system(words, ttl=None):
        control = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
        return [{"type": "text", "text": f"{words} " * 200, "cache_control": control}]

    def charge(key, sys_blocks):
        before = ledger(key)["spent_usd"]
        r = post(app, "/v1/messages", {"model": CLAUDE, "max_tokens": 8, "system": sys_blocks, "messages": ASK}, key=key)
        assert r.status_code == 200, r.text
        return r.json()["usage"], ledger(key)["spent_usd"] - before

    charge("dev", system("cherry"))  # dev's write
    n0 = len(standin.billed)
    hit_usage, hit = charge("other", system("cherry"))
    miss_usage, miss = charge("other", system("orange"))  # one token a word, as "cherry": the same length
    assert standin.billed[n0].get("cache_read_input_tokens") and standin.billed[n0 + 1].get("cache_creation_input_tokens")
    print(json.dumps({"hit_usd": hit, "miss_usd": miss, "hit_billed_usd": bill(standin.billed[n0]),
                      "miss_billed_usd": bill(standin.billed[n0 + 1])}))
    assert hit_usage == miss_usage and hit == pytest.approx(miss, rel=1e-9) and hit > bill(standin.billed[n0])
    _, hour = charge("other", system("lemon", ttl="1h"))
    assert standin.billed[-1]["cache_creation"]["ephemeral_1h_input_tokens"] > 0
    assert hour == pytest.approx(bill(standin.billed[-1]), rel=1e-6) and hour > miss  # 2x input, not 1.25x


def _read(app, path, body, key, headers):
    """A whole or streamed answer's status and body (a stream's: its events), read to its end."""
    with httpx.stream("POST", f"{app[0]}{path}", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEYS[key]}", **headers}) as s:
        if not body.get("stream"):
            return s.status_code, json.loads(s.read())
        lines = [line for line in s.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
        return s.status_code, [json.loads(line[6:]) for line in lines]


def test_every_billed_tier_and_hosted_call_is_charged_as_the_provider_bills_it(app):
    """Over HTTP, each request's charge to its key against the stand-in provider's own bill for the answer it
    generated: chat at the ``priority`` and ``flex`` service tiers and at none (whole and streamed); a Responses
    request whose model ran hosted web searches (``web_search_call`` items, billed per call: three, then one streamed); a
    Messages request with the 1M-context beta whose prompt is over the long-context tier's size (every price at the
    tier's multiples) and one under it."""
    standin, agent = app[1], app[2]
    long_ask = [{"role": "user", "content": "Summarise this: " + "a long document of many words " * 10}]
    beta = {"anthropic-beta": "context-1m-2025-08-07"}
    cases = [  # (what, path, body, headers)
        ("chat priority", "/v1/chat/completions", {"model": TIERED, "messages": ASK, "service_tier": "priority"}, {}),
        ("chat flex streamed", "/v1/chat/completions",
         {"model": TIERED, "messages": ASK, "service_tier": "flex", "stream": True}, {}),
        ("chat default", "/v1/chat/completions", {"model": TIERED, "messages": ASK}, {}),
        ("responses searched", "/v1/responses", {"model": TIERED, "input": "Who won? [search] [search] [search]",
                                                 "tools": [{"type": "web_search"}]}, {}),
        ("responses searched streamed", "/v1/responses",
         {"model": TIERED, "input": "Who won? [search]", "tools": [{"type": "web_search"}], "stream": True}, {}),
        ("responses priority", "/v1/responses", {"model": TIERED, "input": "Hi", "service_tier": "priority"}, {}),
        ("messages long", "/v1/messages", {"model": LONG, "max_tokens": 8, "messages": long_ask}, beta),
        ("messages long streamed", "/v1/messages",
         {"model": LONG, "max_tokens": 8, "messages": long_ask, "stream": True}, beta),
        ("messages short", "/v1/messages", {"model": LONG, "max_tokens": 8, "messages": ASK}, beta),
    ]
    seen = {}
    for what, path, body, headers in cases:
        provider = standin if path == "/v1/messages" else agent
        n, before = len(provider.billed), ledger("tiers")["spent_usd"]
        status, answer = _read(app, path, body, "tiers", headers)
        assert status == 200, (what, status, answer)
        assert len(provider.billed) == n + 1, what
        entry = provider.billed[-1]
        billed = bill(entry) if provider is standin else agent_standin.bill(entry)
        charged = charged_since("tiers", before, billed)
        seen[what] = {"charged_usd": charged, "billed_usd": billed}
        assert charged == pytest.approx(billed, rel=1e-6), (what, seen[what])
    print(json.dumps(seen))
    base_chat = agent_standin.bill(({"prompt_tokens": 1000, "completion_tokens": 20}, "default", 0))
    assert seen["chat priority"]["billed_usd"] == pytest.approx(2 * base_chat)
    assert seen["chat flex streamed"]["billed_usd"] == pytest.approx(0.5 * base_chat)
    searches = 3 * agent_standin.PRICES["web_search_call"]
    assert seen["responses searched"]["billed_usd"] == pytest.approx(base_chat + searches)
    assert standin.billed[-3].get("long_context") and standin.billed[-2].get("long_context")
    assert not standin.billed[-1].get("long_context")


def test_a_beta_that_turns_on_an_unpriced_price_tier_is_not_forwarded(app):
    """The client's ``anthropic-beta`` goes to the endpoint, but not a beta that turns on a price tier the model's
    price lacks: the 1M-token context (2x input past 200,000 tokens) where it has no ``long_context`` — so nothing is
    billed above what the key is charged. A model whose price has the tier is sent it."""
    from proxray.pool.spec import PriceSpec
    from proxray.serve.protocols.messages.turn import priced_betas

    standin = app[1]
    betas = "claude-code-20250219,context-1m-2025-08-07,interleaved-thinking-2025-05-14"
    n0 = len(standin.requests)
    r = post(app, "/v1/messages", {"model": CLAUDE, "max_tokens": 8, "messages": ASK}, key="other",
             **{"anthropic-beta": betas})
    assert r.status_code == 200, r.text
    (sent,) = [h for p, h, _ in standin.requests[n0:] if p.endswith("/messages")]
    assert {k.lower(): v for k, v in sent.items()}["anthropic-beta"] == \
        "claude-code-20250219,interleaved-thinking-2025-05-14"
    tiered = PriceSpec(input_per_mtok=3.0, output_per_mtok=15.0, long_context={"above_tokens": 200_000})
    assert priced_betas({"anthropic-beta": betas}, tiered) == {"anthropic-beta": betas}
    assert priced_betas({"anthropic-beta": "context-1m-2025-08-07"}, PriceSpec(input_per_mtok=1, output_per_mtok=1)) == {}
