"""Tenant controls over HTTP on a running app (127.0.0.1, the openai client and httpx), driven as an operator's load
would drive them: many requests at once on a budget, streams whose client did not ask for usage, a named request past
a ``cheapest`` budget, two keys sharing a conversation id, a restricted key's view of the models, feedback past a rate,
and each shared actor killed (``ray.kill``) under keyed load. Bounded in count and time; waits on state."""
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from openai_standin import MODEL, StandIn, key_file
from serve_helpers import STRONG, WEAK, free_port, kill_under_load, ray_address, start_app, stop_app

pytestmark = pytest.mark.slow

SLOW_DEAR, FREE, EXTERNAL, LIMITED = "google/gemma-7b-it", "microsoft/Phi-3-small-8k-instruct", "frontier", "frontier-2rps"
DOWN = "frontier-down"  # cheap, and its endpoint answers 500 to every prompt that says "[down]"
PRICES = {WEAK: {"input_per_mtok": 0.1, "output_per_mtok": 0.2}, STRONG: {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
          SLOW_DEAR: {"input_per_mtok": 3.0, "output_per_mtok": 15.0}}
ASK = "Tom has 3 boxes of 4 apples. How many apples?"
KEYS: dict = {}
SHARDS = 3  # the keys ledgers of the app


@pytest.fixture(scope="module")
def app(tmp_path_factory, encoder):
    from proxray.serve.tenancy.keys import new_key_entry

    tmp = tmp_path_factory.mktemp("tenancy")
    key, _ = key_file(tmp)
    standin = StandIn(key, faults=False)
    one = {"min_replicas": 1, "max_replicas": 1}
    models = [{"id": WEAK, "engine": "sim", "autoscaling": one, "price": PRICES[WEAK]},
              {"id": STRONG, "engine": "sim", "autoscaling": one, "price": PRICES[STRONG]},
              {"id": SLOW_DEAR, "engine": "sim", "engine_kwargs": {"latency_s": 2.0, "word_latency_s": 0.1},
               "max_ongoing_requests": 64,
               "autoscaling": one, "price": PRICES[SLOW_DEAR]},
              {"id": FREE, "engine": "sim", "autoscaling": one},  # no price: charged at the router's estimate
              {"id": EXTERNAL, "engine": "openai", "source": MODEL, "base_url": standin.url,
               "api_key_file": str(tmp / "api_key"), "price": {"input_per_mtok": 0.2, "output_per_mtok": 0.4},
               "rate_limit": {"requests_per_minute": 60000}},
              {"id": LIMITED, "engine": "openai", "source": MODEL, "base_url": standin.url, "timeout_s": 5,
               "api_key_file": str(tmp / "api_key"), "rate_limit": {"requests_per_minute": 120}},
              {"id": DOWN, "engine": "openai", "source": MODEL, "base_url": standin.url, "timeout_s": 5,
               "max_retries": 0, "api_key_file": str(tmp / "api_key"),
               "price": {"input_per_mtok": 0.15, "output_per_mtok": 0.3}}]
    f = tmp / "keys.yaml"
    # one answer of SLOW_DEAR with max_tokens 8: ~30 prompt and 8 completion tokens -> ~2e-4 USD
    # the bursts of 40 at once are about the budget: room for all 40 on the replica (the default is half its 64)
    KEYS["burst"] = new_key_entry(f, "burst", budget={"usd": 1e-3, "over_budget": "reject"}, max_concurrent=64)
    KEYS["fallback"] = new_key_entry(f, "falls-back", budget={"usd": 1e-3, "over_budget": "reject"}, max_concurrent=64)
    KEYS["streams"] = new_key_entry(f, "streams", budget={"usd": 6e-4, "over_budget": "reject"})
    KEYS["down"] = new_key_entry(f, "down", budget={"usd": 1e-9, "over_budget": "cheapest"})
    KEYS["free"] = new_key_entry(f, "free", budget={"usd": 1.0})
    KEYS["a"] = new_key_entry(f, "tenant-a")
    KEYS["b"] = new_key_entry(f, "tenant-b", allowed_models=[WEAK, STRONG])
    KEYS["slow"] = new_key_entry(f, "three-a-minute", requests_per_minute=3)
    KEYS["load"] = new_key_entry(f, "load", requests_per_minute=100000, budget={"usd": 100.0})
    KEYS["early"] = new_key_entry(f, "leaves-early", budget={"usd": 1e-3, "over_budget": "reject"})
    KEYS["n"] = new_key_entry(f, "asks-for-n", budget={"usd": 3e-3, "over_budget": "reject"})
    KEYS["mute"] = new_key_entry(f, "mute", feedback="off")
    url = start_app(tmp, encoder, models, keys_file=str(f), timeout_s=20, request_timeout_s=60,
                    keys_ledger_shards=SHARDS,  # every budget here kept by one of three ledgers
                    responses={"max_bytes": 2**20},  # a key's share: 512 KiB
                    profile={SLOW_DEAR: (0.95, 2e-4), FREE: (0.2, 5e-5), EXTERNAL: (0.3, 1e-6),
                             LIMITED: (0.1, 1e-6), DOWN: (0.05, 1e-4)},
                    # tracing on, its collector down (nothing listens there): spans are lost, never a request
                    env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}"})
    yield url, standin
    stop_app()
    standin.stop()


def client(app, name):
    from openai import OpenAI

    return OpenAI(base_url=f"{app[0]}/v1", api_key=KEYS[name], max_retries=0, timeout=60)


def ledger_of(name):
    """The name of the ledger that keeps key ``name``."""
    from proxray.serve.tenancy.ledger import shard_name, shard_of

    return shard_name("proxray", shard_of(name, SHARDS), SHARDS)


def ledger_report(name):
    import ray

    for _ in range(200):  # settles are sent after the answers: wait until nothing is held
        rep = ray.get(ray.get_actor(ledger_of(name), namespace="proxray").report.remote()).get(name, {})
        if rep and rep["held_usd"] == 0:
            return rep
        time.sleep(0.05)
    raise AssertionError(f"{name}: holds never settled: {rep}")


def post(app, key, body, path="/v1/chat/completions"):
    return httpx.post(f"{app[0]}{path}", json=body, headers={"Authorization": f"Bearer {KEYS[key]}"}, timeout=60)


def test_a_burst_on_a_budget_spends_at_most_one_hold_past_it(app):
    """40 requests at once to a model whose answers take 2 s, on a budget of about five answers: the holds stop the
    burst at the budget, the rest get a 429 insufficient_quota, and what was spent is within one answer of it."""
    body = {"model": SLOW_DEAR, "max_tokens": 8, "messages": [{"role": "user", "content": ASK}]}
    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(lambda _: post(app, "burst", body), range(40)))
    codes = [r.status_code for r in answers]
    ok = [r.json() for r in answers if r.status_code == 200]
    assert set(codes) <= {200, 429} and 1 <= len(ok) <= 6, codes
    assert all(r.json()["error"]["type"] == "insufficient_quota" for r in answers if r.status_code == 429)
    one = max(PRICES[SLOW_DEAR]["input_per_mtok"] * a["usage"]["prompt_tokens"] / 1e6
              + PRICES[SLOW_DEAR]["output_per_mtok"] * a["usage"]["completion_tokens"] / 1e6 for a in ok)
    spent = ledger_report("burst")["spent_usd"]
    assert spent == pytest.approx(sum(PRICES[SLOW_DEAR]["input_per_mtok"] * a["usage"]["prompt_tokens"] / 1e6
                                      + PRICES[SLOW_DEAR]["output_per_mtok"] * a["usage"]["completion_tokens"] / 1e6
                                      for a in ok))
    assert spent <= 1e-3 + one, (spent, one)
    print(json.dumps({"burst_answered": len(ok), "refused": codes.count(429), "spent_usd": spent, "budget_usd": 1e-3,
                      "one_answer_usd": one}))


def test_a_fallback_to_a_dearer_model_is_held_at_its_price_before_it_is_asked(app):
    """40 routed requests at once on a budget of about five of SLOW_DEAR's answers, among a cheap model whose endpoint
    is down and SLOW_DEAR, cost first: each is held at the cheap model's bound once planned, and at SLOW_DEAR's before
    its fallback asks it — so the budget stops the burst there (429 insufficient_quota), and what was spent is within
    one answer of it (before: the holds stayed at the cheap model's, and the fallbacks spent several budgets)."""
    body = {"model": "proxray", "max_tokens": 8, "messages": [{"role": "user", "content": ASK + " [down]"}],
            "proxray": {"allowed_models": [DOWN, SLOW_DEAR], "lam": 1e9}}
    import time

    def staggered(i):  # arriving over 2 s, while the first are still answered by SLOW_DEAR (2 s each)
        time.sleep(0.05 * i)
        return post(app, "fallback", body)

    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(staggered, range(40)))
    codes = [r.status_code for r in answers]
    ok = [r.json() for r in answers if r.status_code == 200]
    assert set(codes) <= {200, 429} and 1 <= len(ok) <= 6, (codes, [r.text[:300] for r in answers if r.status_code not in (200, 429)][:2])
    assert all(a["model"] == SLOW_DEAR and a["proxray"]["fallback_from"] == [DOWN] for a in ok)
    assert all(r.json()["error"]["type"] == "insufficient_quota" for r in answers if r.status_code == 429)
    one = max(PRICES[SLOW_DEAR]["input_per_mtok"] * a["usage"]["prompt_tokens"] / 1e6
              + PRICES[SLOW_DEAR]["output_per_mtok"] * a["usage"]["completion_tokens"] / 1e6 for a in ok)
    spent = ledger_report("falls-back")["spent_usd"]
    assert spent <= 1e-3 + one, (spent, one)
    print(json.dumps({"fallback_answered": len(ok), "refused": codes.count(429), "spent_usd": spent}))


def test_streams_are_charged_whether_or_not_the_client_asked_for_usage(app):
    c = client(app, "streams")
    answered = 0
    for _ in range(8):
        try:
            chunks = list(c.chat.completions.create(model=SLOW_DEAR, max_tokens=8, stream=True,
                                                    messages=[{"role": "user", "content": ASK}]))
        except Exception as e:  # noqa: BLE001 - the openai SDK's RateLimitError
            assert "insufficient_quota" in str(e) or getattr(e, "status_code", 0) == 429, e
            continue
        assert all(ch.usage is None for ch in chunks)  # not asked for: not given, but counted
        answered += 1
    assert 1 <= answered <= 4
    spent = ledger_report("streams")["spent_usd"]
    assert spent > 0
    print(json.dumps({"streams_answered": answered, "of": 8, "spent_usd": spent, "budget_usd": 6e-4}))


def test_over_a_cheapest_budget_a_named_pricier_model_is_refused_naming_the_cheapest(app):
    import openai

    c = client(app, "down")  # a budget no request's hold fits in: over it from the first request
    with pytest.raises(openai.RateLimitError) as e:
        c.chat.completions.create(model=STRONG, max_tokens=8, messages=[{"role": "user", "content": ASK}])
    assert f"the cheapest model it may use, '{WEAK}'" in str(e.value) and e.value.body["type"] == "insufficient_quota"
    routed = c.chat.completions.create(model="proxray", max_tokens=8, messages=[{"role": "user", "content": ASK}])
    assert routed.model_extra["proxray"]["key"]["over_budget"] and routed.model_extra["proxray"]["lam"] == 1e9


def test_a_named_model_without_a_price_is_charged_its_estimate(app):
    client(app, "free").chat.completions.create(model=FREE, max_tokens=8, messages=[{"role": "user", "content": ASK}])
    assert ledger_report("free")["spent_usd"] == pytest.approx(5e-5, rel=0.5)  # the router's estimate for it


def test_a_second_key_learns_nothing_of_the_firsts_conversations_or_models(app):
    a, b = client(app, "a"), client(app, "b")
    turn = dict(model="proxray", max_tokens=8, messages=[{"role": "user", "content": ASK}],
                extra_body={"proxray": {"conversation": "shared-id", "lam": 0.0, "allowed_models": [WEAK, STRONG]}})
    first = a.chat.completions.create(**turn)
    for _ in range(100):  # the book remembers after the answer: wait until it knows
        again = a.chat.completions.create(**turn).model_extra["proxray"]["conversation"]
        if again["action"] != "new":
            break
        time.sleep(0.05)
    assert again["previous"] == first.model
    theirs = b.chat.completions.create(model="proxray", max_tokens=8, messages=[{"role": "user", "content": ASK}],
                                       extra_body={"proxray": {"conversation": "shared-id", "explain": True}})
    report = theirs.model_extra["proxray"]
    assert report["conversation"]["action"] == "new" and report["conversation"]["previous"] is None
    assert set(report["estimates"]) <= {WEAK, STRONG}  # the key's models only, also in what explain shows
    assert set(json.dumps(report["evidence"]).split('"')) & {SLOW_DEAR, FREE, EXTERNAL} == set()
    assert a.chat.completions.create(**turn).model_extra["proxray"]["conversation"]["previous"] == first.model
    listed = b.models.list().data
    assert [m.id for m in listed] == ["proxray", *sorted([WEAK, STRONG])]
    assert set(listed[0].model_extra["routes_to"]) == {WEAK, STRONG}
    missing = httpx.get(f"{app[0]}/v1/models/{SLOW_DEAR}", headers={"Authorization": f"Bearer {KEYS['b']}"})
    assert missing.status_code == 404 and SLOW_DEAR not in missing.json()["error"]["message"].split("one of:")[1]


def test_feedback_counts_toward_the_keys_rate(app):
    codes = [post(app, "slow", {"id": "chatcmpl-none", "score": 1.0}, path="/v1/feedback").status_code
             for _ in range(5)]
    assert codes[:3] == [404] * 3 and codes[3:] == [429, 429]


def test_a_key_holding_64_slow_streams_leaves_another_key_answered_at_once(app):
    """Key A opens 64 streams at once to a model whose answers take ~5 s: it holds half the replica's 64 slots (its
    default share), the rest of its streams get a 429 at once; once they have, key B's request is answered, within
    5 s, while A's streams still run (before: B waited past its timeout)."""
    import threading

    slow = {"model": SLOW_DEAR, "max_tokens": 30, "stream": True, "messages": [{"role": "user", "content": ASK}]}
    codes, refused = [], threading.Semaphore(0)

    def stream(_):
        with httpx.stream("POST", f"{app[0]}/v1/chat/completions", json=slow, timeout=60,
                          headers={"Authorization": f"Bearer {KEYS['a']}"}) as r:
            codes.append(r.status_code)
            if r.status_code == 429:
                refused.release()
            r.read()
        return time.monotonic()

    with ThreadPoolExecutor(64) as pool:
        ends = pool.map(stream, range(64))
        for _ in range(32):  # A's share is full: the refusals came
            assert refused.acquire(timeout=60)
        t0 = time.monotonic()
        b = post(app, "b", {"model": WEAK, "max_tokens": 8, "messages": [{"role": "user", "content": ASK}]})
        answered = time.monotonic()
        last = max(ends)
    assert b.status_code == 200 and answered - t0 < 5.0, (b.status_code, answered - t0)
    assert last > answered  # A's streams still ran when B was answered
    assert codes.count(429) == 32 and codes.count(200) == 32, codes


def test_a_limiter_overloaded_three_times_for_20_s_serves_a_quarter_of_its_limit_10_s_later(app):
    """2 requests a second allowed; 6 a second sent for 20 s (those the limit would hold past the model's 5 s are
    refused at once with a 429, taking no slot); 10 s later, one every 2 s: every one answered by the model."""
    body = {"model": LIMITED, "max_tokens": 8, "messages": [{"role": "user", "content": ASK}]}
    t0, futures = time.monotonic(), []
    with ThreadPoolExecutor(32) as pool:
        for i in range(120):
            time.sleep(max(0.0, t0 + i / 6 - time.monotonic()))
            futures.append(pool.submit(post, app, "a", body))
        burst = [f.result().status_code for f in futures]
    time.sleep(max(0.0, t0 + 30.0 - time.monotonic()))
    later = []
    for i in range(5):
        time.sleep(max(0.0, t0 + 30.0 + 2 * i - time.monotonic()))
        later.append(post(app, "a", body).status_code)
    assert set(burst) <= {200, 429} and 40 <= burst.count(200) <= 60, burst
    assert later == [200] * 5
    print(json.dumps({"limiter_burst_answered": burst.count(200), "burst_sent": len(burst), "later": later}))


def _load(app, stop, seen):
    """One client sending keyed requests (routed, named, streamed, in a conversation) until told to stop."""
    c = httpx.Client(timeout=30)
    fast = {"allowed_models": [WEAK, STRONG]}
    bodies = [{"model": "proxray", "max_tokens": 8, "messages": [{"role": "user", "content": ASK}],
               "proxray": {"conversation": "load", **fast}},
              {"model": WEAK, "max_tokens": 8, "messages": [{"role": "user", "content": ASK}]},
              {"model": EXTERNAL, "max_tokens": 8, "messages": [{"role": "user", "content": ASK}]},
              {"model": "proxray", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": ASK}],
               "proxray": fast}]
    i = 0
    while not stop.is_set() and i < 2000:
        body = bodies[i % len(bodies)]
        i += 1
        try:
            r = c.post(f"{app[0]}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEYS['load']}"})
            text = r.text
            status = 500 if r.status_code == 200 and body.get("stream") and '"error"' in text else r.status_code
        except httpx.HTTPError as e:
            status, text = 0, type(e).__name__  # a reset or a hang: as bad as a 500
        seen.append((time.monotonic(), status, text[:300]))


@pytest.mark.parametrize("actor", ["proxray-keys", "proxray-conversations-proxray", "proxray-answers-proxray",
                                   "proxray-limit"])
def test_a_shared_actor_killed_under_keyed_load_costs_no_500_and_comes_back(app, actor):
    import ray

    from proxray.common.naming import slug

    if actor == "proxray-limit":  # the external model's limiter
        actor = f"proxray-limit-{slug(EXTERNAL)}"
    if actor == "proxray-keys":  # the ledger that keeps the loading key
        actor = ledger_of("load")
    stop, seen = threading.Event(), []
    clients = [threading.Thread(target=_load, args=(app, stop, seen)) for _ in range(4)]
    for t in clients:
        t.start()
    spent_before = None

    def spent():  # under load: some requests hold, the rest is spent
        nonlocal spent_before
        spent_before = ray.get(ray.get_actor(actor, namespace="proxray").report.remote())["load"]["spent_usd"]

    try:  # load running and the actor up (created on first use), then killed; until the service answers again
        killed = kill_under_load(actor, seen, lambda s: len(s) >= 20, lambda e: e[1] == 200, 3.0,
                                 spent if actor.startswith("proxray-keys") else None)
    finally:
        stop.set()
        for t in clients:
            t.join(60)
    after = [(t - killed, s, text) for t, s, text in seen if t > killed]
    bad = [(round(t, 2), s, text) for t, s, text in after if s not in (200, 503)]
    assert not bad, bad[:5]
    back = min(t for t, s, _ in after if s == 200 and t > 0.5)
    assert back < 15.0, back
    refused = [text for _, s, text in after if s == 503]
    assert all("retry" in text for text in refused), refused[:3]
    if spent_before is not None:  # the ledger came back from its checkpoint, not from nothing (what was held when
        # it was written and settled since counts as held until charged in full: never less than was spent)
        rep = ray.get(ray.get_actor(actor, namespace="proxray").report.remote())["load"]
        assert rep["spent_usd"] + rep["held_usd"] >= spent_before > 0, (rep, spent_before)
    print(json.dumps({"actor": actor, "after_kill": len(after), "503": len(refused), "back_after_s": round(back, 2)}))


def test_streams_left_early_are_charged_their_hold_and_stop_at_the_budget(app):
    """A key that reads the first lines of each stream and closes it — before the usage chunk — is charged each
    stream's hold, never 0, and refused once the holds reach its budget (before: 8 of 8 streams served, $0 charged)."""
    body = {"model": SLOW_DEAR, "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": ASK}]}
    served, refused = 0, 0
    for _ in range(8):
        with httpx.stream("POST", f"{app[0]}/v1/chat/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {KEYS['early']}"}) as r:
            if r.status_code == 429:
                refused += 1
                r.read()
                assert "insufficient_quota" in r.text
                continue
            assert r.status_code == 200
            served += 1
            for i, _ in enumerate(r.iter_lines()):
                if i >= 2:
                    break  # gone, mid-answer
    spent = ledger_report("leaves-early")["spent_usd"]
    print(json.dumps({"left_early_served": served, "refused": refused, "spent_usd": spent, "budget_usd": 1e-3}))
    assert 1 <= served <= 3 and refused == 8 - served
    assert spent >= served * 3e-4  # each charged its hold (~4e-4: the prompt and 16 tokens at 15 USD/Mtok), not 0
    assert spent <= 1e-3


def test_n_answers_are_held_and_a_burst_cannot_overspend(app):
    """8 requests at once, each asking for n=8 answers: each holds eight answers' worth, so the burst stops at the
    budget (before: 8 of 8 answered, ~40 answers' worth spent on a 10-answer budget)."""
    body = {"model": STRONG, "max_tokens": 8, "n": 8, "messages": [{"role": "user", "content": ASK}]}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: post(app, "n", body), range(8)))
    ok = [r.json() for r in answers if r.status_code == 200]
    assert all(len(a["choices"]) == 8 for a in ok), [r.text[:300] for r in answers]
    assert ok, [r.text[:300] for r in answers]
    spent = ledger_report("asks-for-n")["spent_usd"]
    print(json.dumps({"n8_answered": len(ok), "of": 8, "spent_usd": spent, "budget_usd": 3e-3}))
    assert 1 <= len(ok) <= 4 and spent <= 3e-3  # each holds ~1.1e-3 (eight answers of 8 tokens at 15 USD/Mtok)
    assert [r.status_code for r in answers].count(429) == 8 - len(ok)


def test_a_key_learns_nothing_of_other_keys_traffic_and_health_shows_no_pool(app):
    text = "Which planet is known as the Red Planet? Asked by tenant a only."
    reports = []
    for name in ("a", "b", "a"):
        r = client(app, name).chat.completions.create(model="proxray", max_tokens=8,
                                                      messages=[{"role": "user", "content": text}])
        reports.append(r.model_extra["proxray"])
    for report in reports:
        assert not {"embedding_cache", "encoder_batch", "encode_ms"} & set(report["timings"])
        assert "router_path" not in report and "budget" not in report
    assert httpx.get(f"{app[0]}/health", timeout=10).json() == {"status": "ok"}


def test_feedback_off_for_a_key_is_a_403(app):
    r = post(app, "mute", {"id": "chatcmpl-any", "score": 1.0}, path="/v1/feedback")
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"


def test_a_response_too_large_to_store_is_answered_unstored_not_a_500(app):
    """Input of ~600 KB against a key's 512 KiB share of the store: answered, store: false, the reason in the report
    (before: a plain 500 after the answer was charged)."""
    big = [{"role": "user", "content": "apples " * 21000} for _ in range(4)]
    r = httpx.post(f"{app[0]}/v1/responses", timeout=60, headers={"Authorization": f"Bearer {KEYS['a']}"},
                   json={"model": WEAK, "input": big, "max_output_tokens": 8})
    assert r.status_code == 200, r.text
    assert r.json()["store"] is False and "larger than this key's share" in r.json()["proxray"]["not_stored"]
    again = httpx.get(f"{app[0]}/v1/responses/{r.json()['id']}", headers={"Authorization": f"Bearer {KEYS['a']}"})
    assert again.status_code == 404


def test_keys_report_reads_every_ledger_of_the_app(app):
    """`proxray keys report` on an app whose keys are split over three ledgers: every key that spent, each figure its
    own ledger's."""
    import os
    import subprocess
    import sys

    for name in ("free", "tenant-a", "tenant-b"):  # keys of all three ledgers have spent
        post(app, {"free": "free", "tenant-a": "a", "tenant-b": "b"}[name],
             {"model": WEAK, "max_tokens": 4, "messages": [{"role": "user", "content": ASK}]}).raise_for_status()
    mine = {n: ledger_report(n) for n in ("free", "tenant-a", "tenant-b")}
    assert {ledger_of(n) for n in mine} == {f"proxray-keys-proxray-{s}of{SHARDS}" for s in range(SHARDS)}
    shown = subprocess.run([sys.executable, "-m", "proxray", "keys", "report", "--app", "proxray", "--address",
                            ray_address()],  # this test's Ray, not another on the machine
                           capture_output=True, text=True, timeout=120, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert shown.returncode == 0, shown.stderr[-2000:]
    report = json.loads(shown.stdout)
    for n, rep in mine.items():
        assert report[n]["spent_usd"] == pytest.approx(rep["spent_usd"]) and rep["spent_usd"] > 0
