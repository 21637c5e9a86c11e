"""What a key that tries to cheat meets, part by part (no Ray, no HTTP; tests/test_tenancy.py drives the same through
the running app): holds that bound a request whatever its n and body, admission that counts the request's own hold,
a hold settled exactly once, a stream that outlives its hold charged once, the upstream's answer classified in one
place, replayed Responses items without server-side ids."""
import pytest

from proxray.pool.spec import PriceSpec
from proxray.pool.upstream import falls_back, lists_model, model_unknown, retry_same, takes_model_out
from proxray.serve.protocols.responses.turn import replayable, unstored
from proxray.serve.tenancy.gate import Held, KeyGate
from proxray.serve.tenancy.keys import HOLD_TTL_S, KeyLedger, KeySpec
from proxray.serve.tenancy.rules import KeyRules
from proxray.serve.wire import measure

PRICE = PriceSpec(input_per_mtok=1.0, output_per_mtok=2.0)


def gate() -> KeyGate:
    g = KeyGate.__new__(KeyGate)  # its hold and charger, without a ledger actor or metrics
    g.prices = {"m": PRICE}
    g.rules = KeyRules(g.prices)
    return g


def test_a_hold_counts_every_answer_and_the_whole_body():
    g = gate()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    one = g.hold("m", measure(body), None)
    assert one == pytest.approx(PRICE_COST(len('{"messages":[{"role":"user","content":"hi"}],"max_tokens":100}') // 3, 100))
    assert g.hold("m", measure({**body, "n": 8}), None) > 7 * one  # eight answers: eight times max_tokens
    assert g.hold("m", measure({**body, "best_of": 4}), None) > 3 * one
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "description": "x" * 30000}}}]
    assert g.hold("m", measure({**body, "tools": tools}), None) > one + 10000 * 1.0 / 1e6  # a tool's schema is prompt
    assert g.hold("unpriced", measure(body), 0.25) == 0.25  # no price, no bound: the router's estimate stands for it


def PRICE_COST(prompt, completion):
    return (prompt * 1.0 + completion * 2.0) / 1e6


def test_admission_counts_the_requests_own_hold():
    ledger = KeyLedger()
    budget = {"usd": 1.0, "window_s": 3600.0}
    assert ledger.admit("k", None, budget, 0.6, "t1", now=0.0)["reason"] is None
    assert ledger.admit("k", None, budget, 0.6, "t2", now=0.0)["reason"] == "over_budget"  # 0.6 held + 0.6 > 1.0
    ledger.settle("k", "t2", 0.0, now=0.0)
    assert ledger.admit("k", None, budget, 2.0, "t3", now=0.0)["reason"] == "over_budget"  # alone past the budget
    ledger.settle("k", "t3", 0.0, now=0.0)
    ledger.settle("k", "t1", 0.1, now=0.0)
    assert ledger.admit("k", None, budget, 0.6, "t4", now=0.0)["reason"] is None  # 0.1 spent + 0.6 fits


def test_a_stream_that_outlives_its_hold_is_charged_once():
    ledger = KeyLedger()
    budget = {"usd": 10.0, "window_s": 86400.0}
    ledger.admit("k", None, budget, 1.0, "long", now=0.0)
    ledger.admit("k", None, budget, 0.0, "other", now=HOLD_TTL_S + 1)  # the hold expired: charged in full
    assert ledger.report()["k"]["spent_usd"] == pytest.approx(1.0)
    ledger.settle("k", "long", 0.3, now=HOLD_TTL_S + 2)  # the stream ends: it cost 0.3, not 1.0 + 0.3
    assert ledger.report()["k"]["spent_usd"] == pytest.approx(0.3)


class Ledger:
    def __init__(self):
        self.settled = []

    def settle(self, name, ticket, usd, tokens=None):
        self.settled.append((name, ticket, usd))


def test_a_hold_is_settled_exactly_once_on_every_path():
    g = gate()
    g.ledger, g.spend = Ledger(), type("Counter", (), {"inc": lambda *a, **k: None})()
    spec = KeySpec(name="k", sha256="0" * 64, budget={"usd": 1.0})
    released = Held(g, spec)
    released.take()
    released.release()
    released.release()  # refused, then failed too: once
    assert g.ledger.settled == [("k", released.ticket, 0.0)]
    answered = Held(g, spec)
    answered.take()
    charge = answered.charger("m", None, measure({"messages": [], "max_tokens": 10}))
    answered.release()  # once the charger has it, nothing else settles it
    charge(None)  # the client left before the usage chunk: charged its hold, never 0
    charge({"prompt_tokens": 1, "completion_tokens": 1})
    assert len(g.ledger.settled) == 2 and g.ledger.settled[1][2] == pytest.approx(g.hold("m", measure({"messages": [],
                                                                                                       "max_tokens": 10}), None))
    assert Held(g, None).take() is None  # no key: nothing held


def test_a_refused_request_is_released_and_one_past_its_deadline_charged_its_hold():
    """A 4xx or a 503: nothing spent. A 504 once a model had the request: it may have been billed, so the hold at the
    model asked last is charged (the router's estimate where that model has no price), never 0; a 504 before any model
    had it (waiting for a connection): nothing."""
    from proxray.serve.request.plan import Plan

    g = gate()
    g.ledger, g.spend = Ledger(), type("Counter", (), {"inc": lambda *a, **k: None})()
    spec = KeySpec(name="k", sha256="0" * 64, budget={"usd": 1.0})
    body = measure({"messages": [], "max_tokens": 10})
    plan = Plan(candidates=["m", "unpriced"], report={"failures": [{"model": "unpriced"}],
                                                      "estimates": {"unpriced": {"cost": 0.04}}})
    for status, p, usd in ((400, None, 0.0), (503, plan, 0.0), (504, None, 0.0), (504, plan, 0.04)):
        held = Held(g, spec)
        held.take()
        held.refused(status, p, body)
        held.release()  # and nothing settles it again
        assert g.ledger.settled[-1] == ("k", held.ticket, pytest.approx(usd)), status
    held = Held(g, spec)
    held.take()
    held.refused(504, Plan(candidates=["m"], report={}), body)  # no failure recorded: the first candidate
    assert g.ledger.settled[-1][2] == pytest.approx(g.hold("m", body, None)) and len(g.ledger.settled) == 5
    held = Held(g, spec)
    held.take()
    held.refused(504, plan, body, reached=False)  # past the deadline before any model had it: nothing was billed
    assert g.ledger.settled[-1] == ("k", held.ticket, 0.0) and len(g.ledger.settled) == 6


def test_the_upstreams_answer_is_classified_once():
    assert retry_same(429) and retry_same(503) and not retry_same(400) and not retry_same(422)
    assert falls_back(502) and not falls_back(400) and not falls_back(404)
    # a 401 or 403 a client's body can provoke: a probe with the gateway's own key decides, never the answer alone
    assert takes_model_out(401, {}) is None and takes_model_out(403, {}) is None
    assert takes_model_out(404, {"code": "model_not_found", "message": "The model `x` does not exist"})
    assert model_unknown(404, {"type": "not_found_error", "message": "model: claude-x"})  # Anthropic's
    # a message is never read for it: vLLM's says nothing structured (its listing decides), and an echo of a client's id
    assert model_unknown(404, {"message": "The model `x` does not exist.", "type": "NotFoundError"}) is None
    assert model_unknown(404, {"message": "Item with id 'rs_x-model' not found.", "param": "input"}) is None
    assert takes_model_out(400, {}) is False and takes_model_out(500, {}) is False
    assert lists_model({"data": [{"id": "gpt-x"}]}, "gpt-x") and not lists_model({"data": []}, "gpt-x")


def test_replayed_items_carry_no_server_side_ids():
    assert replayable({"type": "message", "id": "msg_1", "role": "assistant", "content": []}) == \
        {"type": "message", "role": "assistant", "content": []}
    assert replayable({"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}) == \
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    assert replayable({"type": "reasoning", "id": "rs_1", "summary": []}) is None  # nothing to replay it from
    assert replayable({"type": "reasoning", "id": "rs_1", "encrypted_content": "e"}) == \
        {"type": "reasoning", "encrypted_content": "e"}


def test_a_response_not_stored_says_so():
    r = unstored({"object": "response", "id": "resp_1", "store": True, "proxray": {"model": "m"}}, "too large")
    assert r["store"] is False and r["proxray"] == {"model": "m", "not_stored": "too large"}
    event = unstored({"type": "response.completed", "response": {"object": "response", "store": True}}, "why")
    assert event["response"]["store"] is False


def test_one_key_policy_decides_use_sight_cheapest_and_past_budget():
    from proxray.serve.errors import RequestError
    from proxray.serve.request.policy import request_policy
    from proxray.serve.protocols.base import RoutingOptions

    cheap, dear = PriceSpec(input_per_mtok=0.1, output_per_mtok=0.2), PriceSpec(input_per_mtok=5.0, output_per_mtok=9.0)
    policy = KeyRules({"cheap": cheap, "dear": dear})
    served = ["cheap", "dear", "free"]
    spec = KeySpec(name="k", sha256="0" * 64, allowed_models=["dear", "free"])
    assert [m for m in served if policy.may_use(spec, m)] == ["dear", "free"]
    assert all(policy.may_use(None, m) for m in served) and policy.visible(None) is None
    assert policy.visible(spec) == ("dear", "free")
    assert policy.cheapest(spec, served) == "dear" and policy.cheapest(None, served) == "cheap"
    assert policy.narrowed(spec, ["cheap", "free"]) == ("free",) and policy.narrowed(spec, None) == ("dear", "free")
    assert request_policy(RoutingOptions(allowed_models=["cheap"]), spec).allowed_models == ()  # the same rule
    assert policy.past_budget(spec, True, "free", served)  # routed: planned again, cost deciding
    assert not policy.past_budget(spec, False, "dear", served)  # the cheapest it may use, by name: as planned
    with pytest.raises(RequestError) as e:
        policy.past_budget(spec, False, "free", served)
    assert e.value.status == 429 and "'dear'" in e.value.message


def test_a_key_holds_at_most_its_concurrent_slots_on_a_replica():
    from proxray.serve.errors import RequestError

    class Counter:
        def inc(self, *_):
            pass

    g = gate()
    g.inflight, g.requests = {}, Counter()
    spec = KeySpec(name="busy", sha256="0" * 64, max_concurrent=2)
    slots = [g.enter(spec), g.enter(spec)]
    with pytest.raises(RequestError) as e:
        g.enter(spec)
    assert e.value.status == 429 and "max_concurrent" in e.value.message and e.value.headers["retry-after"] == "1"
    slots[0].release()
    slots[0].release()  # given back once, whatever calls it
    assert g.inflight["busy"] == 1
    g.enter(spec)
    assert g.enter(None).name is None  # the app's own key: no cap
    with pytest.raises(RequestError):
        g.enter(spec)


def test_a_key_without_its_own_cap_takes_half_the_replicas_slots_and_leaves_the_rest():
    """A key with no ``max_concurrent``: at most half the replica's slots (32 of 64) — its slow streams leave another
    key room on the replica and on the endpoints' slots."""
    from proxray.serve.errors import RequestError

    g = gate()
    g.inflight, g.requests, g.share = {}, type("Counter", (), {"inc": lambda *a: None})(), 32
    slow, other = KeySpec(name="slow", sha256="0" * 64), KeySpec(name="other", sha256="1" * 64)
    held = [g.enter(slow) for _ in range(32)]
    with pytest.raises(RequestError) as e:
        g.enter(slow)
    assert e.value.status == 429 and "32 requests in flight" in e.value.message
    assert g.enter(other).name == "other"  # the other key still has room


def test_a_cached_prompt_and_a_hosted_tool_are_priced_as_billed():
    price = PriceSpec(input_per_mtok=3.0, output_per_mtok=15.0, tool_call_usd={"web_search_requests": 0.01})
    usage = {"prompt_tokens": 152010, "completion_tokens": 100,
             "prompt_tokens_details": {"cached_tokens": 2000, "cache_write_tokens": 150000},
             "server_tool_use": {"web_search_requests": 2}}
    assert price.cost(usage) == pytest.approx((10 * 3 + 2000 * 0.3 + 150000 * 3.75 + 100 * 15) / 1e6 + 0.02)
    assert price.bound(1000, 10, writes_cache=True) == pytest.approx((1000 * 3.75 + 10 * 15) / 1e6)
    assert price.bound(1000, 10) == pytest.approx((1000 * 3 + 10 * 15) / 1e6)


def test_a_keys_prompt_cache_is_salted_apart_on_the_models_that_take_a_salt():
    """A co-hosted model that takes ``cache_salt`` (vLLM) is sent the asking key's, so one key's prefixes are never
    another's cache hits; a model that does not take one (the CPU engines) is sent nothing new; the app's own key none.
    The key's salt wins over the client's; a model the app built on vLLM is salted before it says what it takes."""
    from proxray.serve.deployments.client import TENANT, ModelClient

    sent = []

    class Handle:
        def options(self, **_):
            return self

        @property
        def respond(self):
            return self

        def remote(self, endpoint, body, heartbeat):
            sent.append(body)
            return object()

    client = ModelClient({"vllm": Handle(), "cpu": Handle()})
    client.caps = {"vllm": {"/chat/completions": frozenset({"messages", "cache_salt"})},
                   "cpu": {"/chat/completions": frozenset({"messages"})}}
    body = {"messages": [{"role": "user", "content": "hi"}]}
    TENANT.set("a" * 32)
    client.stream("vllm", "/chat/completions", body)
    client.stream("cpu", "/chat/completions", body)
    TENANT.set("")
    client.stream("vllm", "/chat/completions", body)
    assert sent[0]["cache_salt"] == "a" * 32 and "cache_salt" not in sent[1] and "cache_salt" not in sent[2]
    assert "cache_salt" not in body  # the request's own body untouched
    # a client's own salt (or null) does not take it out of its key's space; a salt of its own divides that space
    TENANT.set("b" * 32)
    for own, want in ((None, "b" * 32), ("", "b" * 32), ("a" * 32, "b" * 32 + ":" + "a" * 32)):
        client.stream("vllm", "/chat/completions", {**body, "cache_salt": own})
        assert sent[-1]["cache_salt"] == want, own
    # a model the app built on vLLM is salted before it says its capabilities (not yet asked: no caps)
    early = ModelClient({"vllm": Handle()}, salted=["vllm"])
    early.stream("vllm", "/chat/completions", body)
    TENANT.set("")
    assert sent[-1]["cache_salt"] == "b" * 32


def test_a_fallback_to_a_model_without_tool_prices_is_refused_for_a_budgeted_key():
    """A budgeted key's request that asks for a hosted tool: a fallback to a model with no price for its calls is not
    asked (400 naming the tool), as a first candidate without one is not; a model with a tool price is held for."""
    import asyncio

    from proxray.serve.errors import RequestError

    g = gate()
    g.prices = {"m": PRICE, "tools": PriceSpec(input_per_mtok=1.0, output_per_mtok=2.0,
                                               tool_call_usd={"web_search_requests": 0.01})}

    class Ledger:
        async def rehold(self, spec, ticket, usd):
            return {"over_budget": False, "spent_usd": 0.0}

    g.ledger = Ledger()
    spec = KeySpec(name="k", sha256="0" * 64, budget={"usd": 1.0, "over_budget": "reject"})
    bound = measure({"messages": [], "max_tokens": 10, "tools": [{"type": "web_search_20250305", "name": "web_search",
                                                                   "max_uses": 3}]})
    with pytest.raises(RequestError) as e:
        asyncio.run(g.hold_fallback(spec, "t", "m", bound, None, 0.0))
    assert e.value.status == 400 and "tools[0]" in e.value.message and "'m'" in e.value.message
    held = asyncio.run(g.hold_fallback(spec, "t", "tools", bound, None, 0.0))
    assert held == pytest.approx(g.hold("tools", bound, None)) and held >= 3 * 0.01  # its three calls held too
    assert asyncio.run(g.hold_fallback(None, None, "m", bound, None, 0.0)) == 0.0  # no key: nothing held, nothing asked


def test_a_hit_is_charged_as_the_miss_it_would_have_been_and_a_one_hour_write_at_its_price():
    """``as_missed``: a cache read charged as the write a miss would have been (``5m`` or ``1h``, as the request
    asked), or as plain input where the request asked for no write — so a hit and a miss of one prompt cost the same;
    ``PriceSpec.cost``: the one-hour cache's writes at 2 × input by default."""
    from proxray.common.pricing import Usage, as_missed, writes_cache

    price = PriceSpec(input_per_mtok=3.0, output_per_mtok=15.0)
    miss = {"prompt_tokens": 1010, "completion_tokens": 4, "prompt_tokens_details": {"cache_write_tokens": 1000}}
    hit = {"prompt_tokens": 1010, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 1000}}
    assert price.cost(as_missed(hit, "5m")) == pytest.approx(price.cost(miss)) and price.cost(miss) > price.cost(hit)
    assert price.cost(as_missed(hit, "")) == pytest.approx(price.tokens(1010, 4))  # automatic caching: plain input
    assert as_missed(miss, "5m") is miss  # nothing read: as billed
    hour = Usage.of_messages({"input_tokens": 10, "output_tokens": 4, "cache_creation_input_tokens": 1000,
                              "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 1000}})
    assert price.cost(hour.chat()) == pytest.approx((10 * 3.0 + 1000 * 6.0 + 4 * 15.0) / 1e6)
    assert price.cost(as_missed(hit, "1h")) == pytest.approx(price.cost(hour.chat()))
    assert Usage.of_messages(hour.messages()) == hour  # written back in Messages' words, split by lifetime
    body = {"system": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]}
    assert writes_cache(body) == "5m" and writes_cache({"messages": []}) == ""
    body["tools"] = [{"name": "t", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    assert writes_cache(body) == "1h" and price.bound(100, 0, "1h") == pytest.approx(100 * 6.0 / 1e6)


def test_hosted_tool_calls_of_a_relayed_responses_answer_are_counted_from_its_items_and_priced():
    """The Responses API reports no usage field for its hosted tools: each ``web_search_call`` item of the answer is
    one call, priced at ``tool_call_usd`` under the item's type (before: three searches charged $0)."""
    from proxray.serve.protocols.responses.turn import ResponsesTurn

    answer = {"object": "response", "status": "completed", "usage": {"input_tokens": 100, "output_tokens": 20,
                                                                     "input_tokens_details": {"cached_tokens": 0}},
              "output": [{"type": "web_search_call", "id": f"ws_{i}", "status": "completed"} for i in range(3)]
              + [{"type": "function_call", "name": "f"}, {"type": "message", "role": "assistant", "content": []}]}
    usage = ResponsesTurn.usage(answer)
    assert usage["server_tool_use"] == {"web_search_call": 3}  # the function call is the client's, not billed apart
    price = PriceSpec(input_per_mtok=1.0, output_per_mtok=4.0, tool_call_usd={"web_search_call": 0.01})
    assert price.cost(usage) == pytest.approx((100 * 1.0 + 20 * 4.0) / 1e6 + 0.03)
    streamed = {"type": "response.completed", "response": answer}  # a stream's last event: the same count
    assert ResponsesTurn.usage(streamed)["server_tool_use"] == {"web_search_call": 3}


def test_the_priority_tier_and_the_long_context_tier_are_charged_and_held_at_their_multipliers():
    """An answer the provider reports at ``service_tier: priority`` is charged 2× (OpenAI's list; flex 0.5×) and a
    request that asks for it is held so; a prompt past a model's ``long_context.above_tokens`` is charged and held at
    its multipliers (Anthropic's: input 2×, output 1.5×). Before: both at the base price."""
    from proxray.serve.protocols.base import Turn

    g = gate()
    price = PriceSpec(input_per_mtok=1.0, output_per_mtok=4.0, long_context={"above_tokens": 200_000})
    g.prices = {"m": price}
    base = {"prompt_tokens": 1000, "completion_tokens": 100}
    usage = Turn.usage({"usage": base, "service_tier": "priority"})
    assert price.cost(usage) == pytest.approx(2 * price.cost(base))
    assert price.cost({**base, "service_tier": "flex"}) == pytest.approx(0.5 * price.cost(base))
    assert price.cost({**base, "service_tier": "default"}) == pytest.approx(price.cost(base))
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    for tier, times in (("priority", 2.0), ("flex", 1.0)):  # a hold never counts a discount
        b = measure({**body, "service_tier": tier})
        assert b.tier == tier and g.hold("m", b, None) == pytest.approx(times * price.bound(b.prompt, b.output))
    long = {"prompt_tokens": 250_000, "completion_tokens": 1000}
    assert price.cost(long) == pytest.approx((250_000 * 2.0 + 1000 * 4.0 * 1.5) / 1e6)
    assert price.cost({"prompt_tokens": 200_000, "completion_tokens": 1000}) == pytest.approx((200_000 + 4000) / 1e6)
    assert price.bound(250_000, 1000) == pytest.approx(price.cost(long))


def test_a_spoken_answer_is_charged_at_the_audio_prices_and_refused_for_a_budget_where_the_model_has_none():
    """Audio tokens (chat's ``audio_tokens`` details) at ``audio_input_per_mtok`` / ``audio_output_per_mtok``; a request
    that asks for audio (``modalities``) is held at the audio output price; a budgeted key's audio request to a model
    with no audio price is a 400 naming ``modalities`` (before: spoken answers charged as text)."""
    import asyncio

    from proxray.serve.errors import RequestError

    price = PriceSpec(input_per_mtok=2.5, output_per_mtok=10.0, audio_input_per_mtok=40.0, audio_output_per_mtok=80.0)
    usage = {"prompt_tokens": 100, "completion_tokens": 50, "prompt_tokens_details": {"audio_tokens": 60},
             "completion_tokens_details": {"audio_tokens": 40}}
    assert price.cost(usage) == pytest.approx((40 * 2.5 + 60 * 40.0 + 10 * 10.0 + 40 * 80.0) / 1e6)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    spoken = measure({**body, "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}})
    assert spoken.audio and not measure(body).audio
    assert price.bound(spoken.prompt, spoken.output, audio=True) == pytest.approx(
        (spoken.prompt * 2.5 + 100 * 80.0) / 1e6)
    g = gate()
    spec = KeySpec(name="k", sha256="0" * 64, budget={"usd": 1.0})
    with pytest.raises(RequestError) as e:
        asyncio.run(g.hold_fallback(spec, "t", "m", spoken, None, 0.0))  # "m": text prices only
    assert e.value.status == 400 and e.value.param == "modalities"
