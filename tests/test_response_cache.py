"""The response cache on a running app (127.0.0.1, a keys file): an exact repeat answered from the cache on every
protocol, whole and streamed, with its usage zeroed and its key charged nothing; a paraphrase answered from the
semantic cache; a key never given another key's answer unless both are in one cache group; tools, opted-out and
non-deterministic requests never served from it; a stream its client left early never kept; a deleted stored response
taking its entry with it; the store's bounds per scope (in process: 10,000 distinct answers of one scope); many
clients at once, and the store killed under them. Bounded in count and time; waits on state."""
import json
import threading
import time

import httpx
import pytest

from serve_helpers import STRONG, WEAK, kill_under_load, ledger, start_app, stop_app

PRICES = {WEAK: {"input_per_mtok": 0.1, "output_per_mtok": 0.2}, STRONG: {"input_per_mtok": 3.0, "output_per_mtok": 15.0}}
KEYS: dict = {}
HEADERS = {"anthropic-version": "2023-06-01"}


@pytest.fixture(scope="module")
def app(tmp_path_factory, encoder):
    from proxray.serve.tenancy.keys import new_key_entry

    tmp = tmp_path_factory.mktemp("cache")
    one = {"min_replicas": 1, "max_replicas": 1}
    models = [{"id": m, "engine": "sim", "autoscaling": one, "price": PRICES[m]} for m in (WEAK, STRONG)]
    f = tmp / "keys.yaml"
    KEYS["a1"] = new_key_entry(f, "team-one", budget={"usd": 1.0}, cache={"group": "team"})
    KEYS["a2"] = new_key_entry(f, "team-two", cache={"group": "team"})
    KEYS["b"] = new_key_entry(f, "alone")
    KEYS["exact-only"] = new_key_entry(f, "exact-only", cache={"semantic": False})
    KEYS["load"] = new_key_entry(f, "load", budget={"usd": 1.0})
    # small bounds, so that one key filling its share is seen over HTTP: 40 answers, 20 a scope; the embedding tier on
    cache = {"max_entries": 40, "scope_share": 0.5, "similarity": 0.98}
    url = start_app(tmp, encoder, models, keys_file=str(f), response_cache=cache, timeout_s=30)
    yield url
    stop_app()


def stored() -> int:
    """How many answers the app's store has kept so far (0 before its first)."""
    import ray

    try:
        store = ray.get_actor("proxray-cache-proxray", namespace="proxray")
    except ValueError:
        return 0
    return ray.get(store.report.remote(), timeout=30)["stored"]


def dumped(x):
    """An answer as JSON objects: an SDK's parsed objects (their extra fields with them) dumped."""
    return [dumped(o) for o in x] if isinstance(x, list) else x.model_dump() if hasattr(x, "model_dump") else x


class Unanswered(AssertionError):
    """The cache's store did not answer a lookup in time (a loaded machine): the answer's report says why."""


def kept(ask, miss: bool | None = None):
    """``ask()``'s answer, returned once the store holds it where it was a miss (``miss``: as its report says): a
    miss's answer is kept by a write the request does not wait on, and a repeat sent at once can reach the store
    before it. ``Unanswered`` where its report says the store did not answer its lookup."""
    before = stored()
    answer = ask()
    if miss is None:
        cache = report(dumped(answer))["cache"]
        if cache["kind"] == "miss" and "why" in cache:
            raise Unanswered(cache["why"])
        miss = cache["kind"] == "miss"
    if miss:
        deadline = time.monotonic() + 30
        while stored() <= before:
            assert time.monotonic() < deadline, "the miss's answer was never kept"
            time.sleep(0.02)
    return answer


def post(app, path, key, body, stream=False):
    """The answer (whole) or every event's object (streamed) of one request of key ``key``, as ``kept`` returns it."""
    return kept(lambda: _post(app, path, key, body, stream))


def on_fresh_asks(test, tries=3):
    """``test(suffix)`` run again with another suffix for its asks where the cache's store did not answer one of its
    lookups in time (each try asks what no earlier try asked): what is asserted is what the cache does when it answers;
    a store that does not is the test of the store killed under load."""
    for n in range(tries):
        try:
            return test(f" [{n}]" if n else "")
        except Unanswered:
            if n == tries - 1:
                raise


def _post(app, path, key, body, stream):
    headers = {"Authorization": f"Bearer {KEYS[key]}", **HEADERS}
    if not stream:
        r = httpx.post(app + path, json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()
    if "chat" in path or "/v1/completions" in path:  # the usage, asked for as clients ask for it
        body = {**body, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", app + path, json={**body, "stream": True}, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line[6:] != "[DONE]"]


def report(answer) -> dict:
    """The first ``proxray`` report in an answer or its events."""
    found = []

    def walk(x):
        if isinstance(x, dict):
            if isinstance(x.get("proxray"), dict) and "routed" in x["proxray"]:
                found.append(x["proxray"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(answer)
    return found[0]


def text(answer) -> str:
    """The answer's text, whatever its protocol, whole or streamed."""
    if isinstance(answer, list):
        parts = []
        for o in answer:
            if o.get("choices"):
                c = o["choices"][0]
                parts.append((c.get("delta") or {}).get("content") or c.get("text") or "")
            elif o.get("type") == "response.output_text.delta":
                parts.append(o["delta"])
            elif o.get("type") == "content_block_delta":
                parts.append(o["delta"].get("text", ""))
        return "".join(parts)
    if "choices" in answer:
        c = answer["choices"][0]
        return c["message"]["content"] if "message" in c else c["text"]
    if answer.get("object") == "response":
        return "".join(p["text"] for item in answer["output"] for p in item.get("content", []) if "text" in p)
    return "".join(b.get("text", "") for b in answer["content"])


def usage_numbers(answer) -> list:
    out = []

    def walk(x, inside=False):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, inside or k == "usage")
        elif isinstance(x, list):
            for v in x:
                walk(v, inside)
        elif inside and isinstance(x, (int, float)) and not isinstance(x, bool):
            out.append(x)
    walk(answer)
    return out


ASK = "What is the capital of Australia?"
PROTOCOLS = {  # path, a cacheable request (temperature 0)
    "chat": ("/v1/chat/completions", {"model": "proxray", "temperature": 0, "max_tokens": 16,
                                      "messages": [{"role": "user", "content": ASK}]}),
    "completions": ("/v1/completions", {"model": "proxray", "temperature": 0, "max_tokens": 16, "prompt": ASK}),
    "responses": ("/v1/responses", {"model": "proxray", "temperature": 0, "max_output_tokens": 16, "input": ASK}),
    "messages": ("/v1/messages", {"model": "proxray", "temperature": 0, "max_tokens": 16,
                                  "messages": [{"role": "user", "content": ASK}]}),
}


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_an_exact_repeat_is_answered_from_the_cache_and_charged_nothing(app, protocol, stream):
    on_fresh_asks(lambda suffix: _exact_repeat(app, protocol, stream, suffix))


def _exact_repeat(app, protocol, stream, suffix):
    path, body = PROTOCOLS[protocol]
    ask = f"{ASK} ({protocol}, {'streamed' if stream else 'whole'}){suffix}"
    body = json.loads(json.dumps(body).replace(ASK, ask))
    first = post(app, path, "a1", body, stream)
    assert report(first)["cache"] == {"kind": "miss"}
    assert sum(usage_numbers(first)) > 0
    before = ledger("team-one")["spent_usd"]
    # the same request, its JSON written otherwise (key order): the same entry
    again = post(app, path, "a1", dict(reversed(list(body.items()))), stream)
    rep = report(again)
    assert rep["cache"]["kind"] == "exact" and rep["cache"]["saved_usd"] > 0, rep
    assert rep["model"] == report(first)["model"]
    assert text(again) == text(first) and text(first)
    assert sum(usage_numbers(again)) == 0  # the usage says what was billed: nothing
    assert ledger("team-one")["spent_usd"] == pytest.approx(before, abs=1e-12)
    if not stream:
        assert again["id"] != first["id"]  # an answer of its own


@pytest.mark.slow
def test_a_paraphrase_is_answered_from_the_semantic_cache_and_a_distinct_question_is_not(app):
    path = "/v1/chat/completions"

    def ask(content, key="b"):
        return post(app, path, key, {"model": "proxray", "temperature": 0, "max_tokens": 16,
                                     "messages": [{"role": "user", "content": content}]})

    first = ask("How many legs does a spider have?")
    assert report(first)["cache"]["kind"] == "miss"
    para = ask("how many  legs does a spider have")  # case, punctuation and whitespace: the same ask
    rep = report(para)["cache"]
    assert rep["kind"] == "semantic" and rep["match"] == "text" and rep["similarity"] > 0.9, rep
    assert text(para) == text(first)
    assert report(ask("How many legs does an insect have?"))["cache"]["kind"] == "miss"  # similarity 0.84
    # the preamble moved: the embedding tier (similarity 0.990 >= 0.98)
    ask("Answer in one word. What color is the sky on a clear day?")
    rep = report(ask("What color is the sky on a clear day? Answer in one word."))["cache"]
    assert rep["kind"] == "semantic" and rep["match"] == "embedding" and rep["similarity"] >= 0.98, rep
    # a key whose semantic cache is off gets only exact hits
    ask("How many legs does a crab have?", "exact-only")
    assert report(ask("how many legs does a crab have", "exact-only"))["cache"]["kind"] == "miss"
    assert report(ask("How many legs does a crab have?", "exact-only"))["cache"]["kind"] == "exact"


@pytest.mark.slow
def test_a_key_never_gets_another_keys_cached_answer_unless_both_are_in_one_group(app):
    on_fresh_asks(lambda suffix: _scoped(app, suffix))


def _scoped(app, suffix):
    path = "/v1/chat/completions"
    body = {"model": "proxray", "temperature": 0, "max_tokens": 16,
            "messages": [{"role": "user", "content": f"Name the largest planet of the solar system{suffix}."}]}
    assert report(post(app, path, "a1", body))["cache"]["kind"] == "miss"
    assert report(post(app, path, "a2", body))["cache"]["kind"] == "exact"  # the same group
    assert report(post(app, path, "b", body))["cache"]["kind"] == "miss"  # exact: its own scope
    para = {**body, "messages": [{"role": "user", "content": f"name the largest planet of the solar system{suffix}"}]}
    assert report(post(app, path, "exact-only", para))["cache"]["kind"] == "miss"  # nor semantic
    assert report(post(app, path, "b", para))["cache"]["kind"] == "semantic"  # b's own answer


@pytest.mark.slow
def test_tools_an_opt_out_and_a_sampled_request_are_never_served_from_the_cache(app):
    path = "/v1/chat/completions"
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
    base = {"model": "proxray", "max_tokens": 16, "messages": [{"role": "user", "content": "Weather in Oslo?"}]}
    cases = {"tools": {**base, "temperature": 0, "tools": [tool]},
             "the request said cache: false": {**base, "temperature": 0, "proxray": {"cache": False}},
             "not deterministic": {**base, "temperature": 0.7}}
    for why, body in cases.items():
        for _ in range(2):
            rep = report(post(app, path, "b", body))["cache"]
            assert rep["kind"] == "off" and rep["why"].startswith(why), rep
    seeded = {**base, "temperature": 0.7, "seed": 3}  # a seed makes it cacheable
    post(app, path, "b", seeded)
    assert report(post(app, path, "b", seeded))["cache"]["kind"] == "exact"


@pytest.mark.slow
def test_a_deleted_stored_response_deletes_its_cache_entry(app):
    body = {"model": "proxray", "temperature": 0, "max_output_tokens": 16, "input": "Spell the word cache backwards."}
    first = post(app, "/v1/responses", "b", body)
    assert report(post(app, "/v1/responses", "b", body))["cache"]["kind"] == "exact"
    r = httpx.delete(f"{app}/v1/responses/{first['id']}", headers={"Authorization": f"Bearer {KEYS['b']}"}, timeout=30)
    assert r.status_code == 200 and r.json()["deleted"]
    assert report(post(app, "/v1/responses", "b", body))["cache"]["kind"] == "miss"


@pytest.mark.slow
def test_one_key_filling_its_share_drops_its_own_answers_never_another_scopes(app):
    import ray

    path = "/v1/chat/completions"
    kept = {"model": "proxray", "temperature": 0, "max_tokens": 8, "messages": [{"role": "user", "content": "Kept?"}]}
    post(app, path, "a2", kept)
    for i in range(45):  # past its share (20) and past the store (40)
        post(app, path, "b", {**kept, "messages": [{"role": "user", "content": f"Distinct question number {i}"}]})
    rep = ray.get(ray.get_actor("proxray-cache-proxray", namespace="proxray").report.remote())
    assert rep["entries"] <= 40 and all(s["entries"] <= 20 for s in rep["scopes"].values()), rep
    assert report(post(app, path, "a2", kept))["cache"]["kind"] == "exact"  # the group's answer still there


@pytest.mark.slow
def test_the_openai_and_anthropic_sdks_read_a_hit_as_a_models_answer(app):
    """A hit, whole and streamed, parsed by the clients users point at the gateway: the same text as the miss, usage 0,
    the report's ``cache`` among the extra fields; on chat completions, the Responses API and the Messages API."""
    from anthropic import Anthropic
    from openai import OpenAI

    oa = OpenAI(base_url=f"{app}/v1", api_key=KEYS["b"], max_retries=0, timeout=60)
    ask = {"model": "proxray", "temperature": 0, "max_tokens": 16,
           "messages": [{"role": "user", "content": "Which ocean is the largest? (SDK)"}]}
    miss, hit = kept(lambda: oa.chat.completions.create(**ask)), oa.chat.completions.create(**ask)
    assert miss.model_extra["proxray"]["cache"]["kind"] == "miss"
    assert hit.model_extra["proxray"]["cache"]["kind"] == "exact"
    assert hit.choices[0].message.content == miss.choices[0].message.content and hit.usage.total_tokens == 0
    assert hit.id != miss.id
    kept(lambda: list(oa.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})))  # its miss
    chunks = list(oa.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == miss.choices[0].message.content
    assert chunks[-1].usage.total_tokens == 0
    body = {"model": "proxray", "temperature": 0, "max_output_tokens": 16,
            "input": "Which desert is the largest? (SDK)"}
    first, again = kept(lambda: oa.responses.create(**body)), oa.responses.create(**body)
    assert again.model_extra["proxray"]["cache"]["kind"] == "exact" and again.output_text == first.output_text
    assert again.usage.output_tokens == 0 and again.id != first.id
    claude = Anthropic(base_url=app, api_key=KEYS["b"], max_retries=0, timeout=60)
    said = {"model": "proxray", "max_tokens": 16, "extra_body": {"temperature": 0},
            "messages": [{"role": "user", "content": "Which river is the longest? (SDK)"}]}
    m1, m2 = kept(lambda: claude.messages.create(**said)), claude.messages.create(**said)
    assert m2.model_extra["proxray"]["cache"]["kind"] == "exact" and m2.content[0].text == m1.content[0].text
    assert m2.usage.output_tokens == 0 and m2.id != m1.id
    def stream_once():
        with claude.messages.stream(**said) as stream:
            return stream.get_final_message()

    kept(stream_once, miss=True)  # a stream's own miss, then its hit
    streamed = stream_once()
    assert streamed.content[0].text == m1.content[0].text and streamed.usage.output_tokens == 0


QUESTIONS = [f"Under load: what is {i} plus {i}?" for i in range(6)]


def _load(app, stop, seen):
    """One client asking the same few questions until ``stop``: (time, status, cache kind, answer's cost)."""
    i = 0
    while not stop.is_set():
        i += 1
        body = {"model": "proxray", "temperature": 0, "max_tokens": 8,
                "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]}
        try:
            r = httpx.post(app + "/v1/chat/completions", json=body, timeout=60,
                           headers={"Authorization": f"Bearer {KEYS['load']}"})
        except httpx.HTTPError as e:  # a reset or a hang: as bad as a 500
            seen.append((time.monotonic(), type(e).__name__, None, 0.0))
            continue
        if r.status_code != 200:
            seen.append((time.monotonic(), r.status_code, None, 0.0))
            continue
        a = r.json()
        rep, price, used = a["proxray"], PRICES[a["model"]], a["usage"]
        cost = (used["prompt_tokens"] * price["input_per_mtok"]
                + used["completion_tokens"] * price["output_per_mtok"]) / 1e6
        seen.append((time.monotonic(), 200, rep["cache"]["kind"], cost))


@pytest.mark.slow
def test_many_clients_at_once_and_the_store_killed_under_them_lose_no_request_and_no_charge(app):
    """Six clients repeating six questions: every request answered 200 — before, while and after the cache's store is
    killed (a lookup that finds it gone is a miss, answered by the model) — every hit charged nothing and every miss its
    usage, the key's ledger the sum of what its answers were charged; the store, started anew by Ray, fills again."""
    import ray

    stop, seen = threading.Event(), []
    clients = [threading.Thread(target=_load, args=(app, stop, seen)) for _ in range(6)]
    for t in clients:
        t.start()
    try:  # killed once hits come, until hits come again after the kill
        killed = kill_under_load("proxray-cache-proxray", seen, lambda s: sum(e[2] == "exact" for e in s) >= 12,
                                 lambda e: e[2] == "exact", 1.0, window=12)
    finally:
        stop.set()
        for t in clients:
            t.join(60)
    assert not [e for e in seen if e[1] != 200], [e for e in seen if e[1] != 200][:5]
    before, after = [e for e in seen if e[0] < killed], [e for e in seen if e[0] > killed + 0.5]
    assert sum(e[2] == "exact" for e in before) >= 12 and sum(e[2] == "exact" for e in after) >= 1
    assert all(e[3] == 0 for e in seen if e[2] == "exact") and all(e[3] > 0 for e in seen if e[2] == "miss")
    assert ledger("load")["spent_usd"] == pytest.approx(sum(e[3] for e in seen), rel=1e-6)
    rep = ray.get(ray.get_actor("proxray-cache-proxray", namespace="proxray").report.remote())
    assert rep["entries"] >= 1
    print(json.dumps({"requests": len(seen), "hits": sum(e[2] == "exact" for e in seen),
                      "misses": sum(e[2] == "miss" for e in seen), "after_kill": len(after)}))


def test_the_store_holds_its_bounds_under_10000_distinct_answers_of_one_scope():
    """In process: one scope's 10,000 answers keep it at its share; another scope's entries stay; expired ones go."""
    import numpy as np

    from proxray.serve.tenancy.response_cache import CacheStore

    store = CacheStore((60.0, 1000, 8 * 2**20, 0.25))
    rng = np.random.default_rng(0)
    record = lambda i: {"model": "m", "objects": json.dumps([{"i": i, "text": "x" * 100}]), "head": 1, "ids": [],
                        "answer_id": f"a{i}", "cost_usd": 1e-4, "constraint": "c", "vector": rng.normal(size=8)}
    for i in range(10):
        assert store.put("other", f"o{i}", record(i), now=0.0)
    for i in range(10_000):
        store.put("busy", f"b{i}", record(i), now=1.0)
    rep = store.report()
    assert rep["scopes"]["busy"]["entries"] == 250 and rep["scopes"]["other"]["entries"] == 10, rep
    assert rep["scopes"]["busy"]["bytes"] <= 0.25 * 8 * 2**20 and rep["bytes"] <= 8 * 2**20
    assert store.get("other", "o3", now=2.0)["kind"] == "exact"
    assert store.get("busy", "b9999", now=2.0) is not None and store.get("busy", "b0", now=2.0) is None
    assert store.get("other", "o3", now=61.0) is None  # past its ttl_s


def test_a_semantic_lookup_stays_in_its_scope_and_constraint_and_under_its_threshold():
    import numpy as np

    from proxray.serve.tenancy.response_cache import CacheStore

    store = CacheStore()
    v = np.array([1.0, 0.0, 0.0])
    rec = {"model": "m", "objects": "[{}]", "head": 1, "ids": [], "answer_id": "x", "cost_usd": 0.0,
           "constraint": "c1", "vector": v}
    store.put("s1", "e1", rec, now=0.0)
    near = np.array([0.99, 0.1, 0.0])
    assert store.get("s1", "other", "c1", near, 0.98, now=1.0)["match"] == "embedding"
    assert store.get("s2", "other", "c1", near, 0.98, now=1.0) is None  # another scope: never
    assert store.get("s1", "other", "c2", near, 0.98, now=1.0) is None  # another constraint
    assert store.get("s1", "other", "c1", near, 0.999, now=1.0) is None  # under the threshold
    assert store.get("s1", "other", "c1", near, None, now=1.0) is None  # the embedding tier off
    store.put("s1", "e2", {**rec, "text": "t", "vector": None}, now=0.0)
    assert store.get("s1", "other", "c1", None, None, "t", now=1.0)["match"] == "text"  # the text tier: no vector
    store.forget("s1", "x")
    assert store.get("s1", "e1", now=1.0) is None and store.get("s1", "e2", now=1.0) is None


def test_a_stream_that_did_not_end_is_never_kept_and_one_that_did_is_kept_whole():
    """``Keep``: a streamed miss is kept only once its stream ended (a client that left early leaves nothing); a
    stream read to its end is kept with every event it sent, its usage zeroed."""
    import asyncio
    from types import SimpleNamespace

    from proxray.serve.stages.cache import Keep

    puts = []
    gw = SimpleNamespace(cache=SimpleNamespace(put=lambda *a: puts.append(a)), gate=SimpleNamespace(prices={}))

    async def events():
        for word in ("one", "two", "three"):
            yield {"id": "chatcmpl-abc123xyz", "choices": [{"delta": {"content": word}}]}
        yield {"id": "chatcmpl-abc123xyz", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}

    def flight():
        return SimpleNamespace(cache={"scope": "s", "exact": "e", "constraint": None, "vector": None, "text": None},
                               req=SimpleNamespace(stream=True), head=[{"id": "chatcmpl-abc123xyz", "choices": []}],
                               gen=events(), turn=SimpleNamespace(answer_id=lambda obj: obj["id"]), model="m",
                               estimate=1e-5)

    async def read(f, n):
        keep, got = Keep(gw).answered(f), []
        async for obj in f.gen:
            got.append(obj)
            if len(got) == n:
                break  # the client left
        keep({"prompt_tokens": 5, "completion_tokens": len(got)})
        return got

    asyncio.run(read(flight(), 1))
    assert puts == []  # one event of four read: nothing kept
    asyncio.run(read(flight(), 99))
    (scope, exact, record), = puts
    kept_objects = json.loads(record["objects"])
    assert (scope, exact, record["head"], len(kept_objects)) == ("s", "e", 1, 5)
    assert kept_objects[-1]["usage"] == {"prompt_tokens": 0, "completion_tokens": 0}


def test_what_a_request_is_keyed_on():
    from types import SimpleNamespace

    from proxray.serve.config import ResponseCacheSpec
    from proxray.serve.request.cache import keys_of, replayed, why_not, zero_usage

    body = {"model": "a", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "temperature": 0, "user": "u1"}
    same = {"temperature": 0, "messages": body["messages"], "model": "b", "user": "u2"}
    exact = lambda *a: keys_of(*a)[0]  # noqa: E731
    constraint = lambda *a: keys_of(*a)[1]  # noqa: E731
    assert exact("chat", False, "m", body) == exact("chat", False, "m", same)
    assert exact("chat", False, "m", body) != exact("chat", True, "m", body)
    assert exact("chat", False, "m", body) != exact("chat", False, "n", body)
    other_ask = {**body, "messages": [body["messages"][0], {"role": "user", "content": "Hello"}]}
    other_system = {**body, "messages": [{"role": "system", "content": "Be long."}, body["messages"][1]]}
    assert constraint("chat", False, "m", body) == constraint("chat", False, "m", other_ask)
    assert constraint("chat", False, "m", body) != constraint("chat", False, "m", other_system)
    assert exact("chat", False, "m", body) != exact("chat", False, "m", other_ask)
    # the text taken out is keyed where it was: the same words as the system's or the user's are two requests
    moved = {**body, "messages": [{"role": "system", "content": "Hi"}, {"role": "user", "content": "Be brief."}]}
    assert exact("chat", False, "m", body) != exact("chat", False, "m", moved)
    assert exact("responses", False, "m", {"input": "Hi"}) != exact("responses", False, "m", {"input": "Ho"})
    turn = SimpleNamespace(tool_loop=False, grown=False)
    spec = ResponseCacheSpec()
    assert why_not(body, turn, spec, False) is None
    two = {**body, "messages": body["messages"] * 2}
    assert why_not(two, turn, spec, False).startswith("2 user turns")
    assert why_not({**body, "temperature": 1}, turn, spec, False).startswith("not deterministic")
    from proxray.serve.request.cache import text_key

    assert text_key("What is  Pi?\n\nTo two places.") == text_key("what is pi\nto two places")
    for a, b in (("not ( True ) and ( True ) is", "( ( not True and True ) ) is"), ("pi is 3.14", "pi is 314"),
                 ("f(1,2)", "f(12)"), ("if x:\n    y\nz", "if x:\n    y\n    z")):
        assert text_key(a) != text_key(b), (a, b)
    assert zero_usage({"usage": {"a": 3, "d": {"b": 2.5}, "t": "x"}, "n": 1}) == {"usage": {"a": 0, "d": {"b": 0}, "t": "x"}, "n": 1}
    out = replayed(json.dumps([{"id": "chatcmpl-abc123xyz"}, {"message": {"id": "chatcmpl-abc123xyz"}}]),
                   ["chatcmpl-abc123xyz"])
    assert out[0]["id"].startswith("chatcmpl-") and out[0]["id"] != "chatcmpl-abc123xyz"
    assert out[1]["message"]["id"] == out[0]["id"]


def test_a_lookup_the_store_does_not_answer_is_a_miss_that_says_why_and_its_answer_is_still_kept():
    """``Lookup`` with a store that does not answer (dead, restarting, or slower than the call's timeout): the request
    goes on to its model, its report's miss names why, and ``Keep`` still offers the store its answer."""
    import asyncio
    from types import SimpleNamespace

    from proxray.common.shared_actor import SharedStateDown
    from proxray.serve.config import ResponseCacheSpec
    from proxray.serve.stages.cache import Keep, Lookup

    async def get(*args):
        raise SharedStateDown("proxray-cache-proxray", "no answer within 2 s")

    puts = []
    gw = SimpleNamespace(args=SimpleNamespace(response_cache=ResponseCacheSpec()), gate=SimpleNamespace(prices={}),
                         cache=SimpleNamespace(get=get, put=lambda *a: puts.append(a)))
    body = {"model": "proxray", "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
    f = SimpleNamespace(plan=SimpleNamespace(candidates=["m"], report={}, vector=None), key=None,
                        req=SimpleNamespace(proxray=None, stream=False), protocol=SimpleNamespace(name="chat"),
                        turn=SimpleNamespace(body=body, tool_loop=False, grown=False, answer_id=lambda o: o["id"]),
                        text="Hi", cache=None, head=[{"id": "chatcmpl-abc123xyz"}], model="m", estimate=1e-5)
    asyncio.run(Lookup(gw).before(f))
    assert f.plan.report["cache"] == {"kind": "miss", "why": "the cache did not answer (no answer within 2 s)"}
    Keep(gw).answered(f)({"prompt_tokens": 3, "completion_tokens": 1})
    assert len(puts) == 1 and puts[0][0] == "app"
