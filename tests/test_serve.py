"""The routed endpoint on a real local Ray Serve, over HTTP on 127.0.0.1, with the openai client.
Marked slow (Serve start-up), run by CI all the same. Traffic is bounded in count and time."""
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytestmark = pytest.mark.slow

from serve_helpers import BROKEN, KEY, SLOW, STRONG, WEAK, start_app, stop_app

ORIGIN = "http://localhost:5173"  # a web page allowed to call the endpoint (cors_origins)


@pytest.fixture(scope="module")
def server(tmp_path_factory, encoder):
    import os

    os.environ["PROXRAY_TEST_KEY"] = KEY
    fast = {"min_replicas": 1, "max_replicas": 1}
    models = [{"id": WEAK, "engine": "sim", "autoscaling": fast},
              {"id": SLOW, "engine": "sim", "engine_kwargs": {"latency_s": 0.4},
               "autoscaling": {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 1,
                               "upscale_delay_s": 0.5, "downscale_delay_s": 3, "metrics_interval_s": 0.5,
                               "look_back_period_s": 1}},
              {"id": BROKEN, "engine": "sim", "engine_kwargs": {"fail_always": True}, "autoscaling": fast},
              {"id": STRONG, "engine": "sim", "autoscaling": fast}]
    from proxray.serve.tenancy.keys import new_key_entry

    tmp = tmp_path_factory.mktemp("serve")
    KEYS["file"] = tmp / "keys.yaml"  # keys with their own policy beside the single key
    KEYS["weak"] = new_key_entry(KEYS["file"], "weak-only", allowed_models=[WEAK])
    KEYS["rate"] = new_key_entry(KEYS["file"], "two-a-minute", requests_per_minute=2)
    KEYS["reject"] = new_key_entry(KEYS["file"], "spent", budget={"usd": 1e-12, "over_budget": "reject"})
    KEYS["down"] = new_key_entry(KEYS["file"], "routed-down", budget={"usd": 1e-12, "over_budget": "cheapest"})
    yield start_app(tmp, encoder, models, api_key_env="PROXRAY_TEST_KEY", keys_file=str(KEYS["file"]),
                    timeout_s=5, max_prompt_chars=2000, docs=True, cors_origins=[ORIGIN])
    stop_app()


KEYS: dict = {}


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=30)


def post(server, path, body, key=KEY, raw=None, headers=None):
    headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    return httpx.post(f"{server}{path}", content=raw if raw is not None else json.dumps(body), headers=headers, timeout=30)


def test_routed_chat_with_the_openai_client(client):
    r = client.chat.completions.with_raw_response.create(
        model="proxray", messages=[{"role": "user", "content": "Tom has 3 boxes of 4 apples. How many apples?"}],
        extra_body={"proxray": {"lam": 0.0, "allowed_models": [WEAK, STRONG]}})
    resp = r.parse()
    assert resp.model == STRONG  # at λ = 0 the more accurate of the two
    rep = resp.model_extra["proxray"]
    assert rep["routed"] and rep["runner_up"] == WEAK and rep["fallback_from"] == []
    assert 0 <= rep["estimated_accuracy"] <= 1 and rep["estimated_cost"] > 0 and rep["outlier_score"] >= 0
    assert r.headers["x-proxray-model"] == STRONG and float(r.headers["x-proxray-outlier-score"]) >= 0
    assert resp.choices[0].message.content and resp.usage.total_tokens > 0
    # a large λ makes cost dominate: the cheap model
    cheap = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": "2+2?"}],
                                           extra_body={"proxray": {"lam": 1e6, "allowed_models": [WEAK, STRONG]}})
    assert cheap.model == WEAK


def test_explain_gives_the_evidence_behind_the_choice(client, server):
    from proxray.data.synthetic import generate_queries

    q = generate_queries(8, seed=1)  # the router's training queries (serve_helpers.fit_router)
    ids, tasks = dict(zip(q.query_id, q.task)), set(q.task)
    ask = dict(model="proxray", messages=[{"role": "user", "content": "Tom has 3 boxes of 4 apples. How many apples?"}])
    opts = {"lam": 0.0, "allowed_models": [WEAK, STRONG]}
    plain = client.chat.completions.create(**ask, extra_body={"proxray": opts}).model_extra["proxray"]
    assert "evidence" not in plain  # off by default
    r = client.chat.completions.create(**ask, extra_body={"proxray": {**opts, "explain": True}})
    rep = r.model_extra["proxray"]
    ev = rep["evidence"]
    assert ev["winner"] == r.model == STRONG and ev["runner_up"] == rep["runner_up"] == WEAK
    assert ev["kind"] == "neighbours" and ev["shown"] == ev["of"] == 10 and ev["weight_shown"] == pytest.approx(1.0)
    weights = [e["weight"] for e in ev["elements"]]
    assert weights == sorted(weights, reverse=True) and all(w > 0 for w in weights)
    assert all(ids[e["query_id"]] == e["task"] for e in ev["elements"])  # named by the table's ids and tasks
    by_model = {m["model"]: m for m in ev["models"]}
    for m, est in rep["estimates"].items():  # the same estimates the choice was made on
        assert by_model[m]["accuracy"] == pytest.approx(est["accuracy"], abs=1e-6) and by_model[m]["candidate"]
    assert not by_model[BROKEN]["candidate"]
    assert ev["margin"] == pytest.approx(by_model[STRONG]["objective"] - by_model[WEAK]["objective"], abs=1e-6)
    assert ev["margin"] >= 0 and ev["outlier_score"] == pytest.approx(rep["outlier_score"], abs=1e-6)
    assert ev["outlier"] == (ev["outlier_score"] > ev["outlier_threshold"]) and ev["explain_ms"] > 0
    assert {e["task"] for e in ev["elements"]} <= tasks
    # the header asks for it too, on a stream as well
    res = post(server, "/v1/chat/completions", {**ask, "proxray": opts}, headers={"x-proxray-explain": "1"})
    assert res.json()["proxray"]["evidence"]["winner"] == STRONG
    with httpx.stream("POST", f"{server}/v1/chat/completions", json={**ask, "stream": True, "proxray": opts},
                      headers={"Authorization": f"Bearer {KEY}", "x-proxray-explain": "true"}, timeout=30) as s:
        first = json.loads(next(line for line in s.iter_lines() if line.startswith("data:"))[5:])
    assert first["proxray"]["evidence"]["winner"] == STRONG
    bad = post(server, "/v1/chat/completions", {**ask, "proxray": {"explain": "very"}})
    assert bad.status_code == 400 and "proxray.explain" in bad.text


def test_a_conversation_keeps_its_model_unless_another_is_better_by_the_margin(client, server):
    import ray

    ask = dict(model="proxray", messages=[{"role": "user", "content": "Tom has 3 boxes of 4 apples. How many apples?"}])

    def turn(lam, cid="conv-1"):
        r = client.chat.completions.create(**ask, extra_body={"proxray": {"lam": lam, "allowed_models": [WEAK, STRONG],
                                                                          "conversation": cid}})
        return r.model, r.model_extra["proxray"]

    model, rep = turn(0.0)
    assert model == STRONG and rep["conversation"] == {"id": "conv-1", "rule": "first_turn", "action": "new",
                                                       "previous": None}
    est = rep["estimates"]
    # a λ at which the cheap model's objective beats the strong one's by 0.01: under the step-down margin (0.05)
    gap = est[STRONG]["accuracy"] - est[WEAK]["accuracy"]
    lam = (gap + 0.01) / (est[STRONG]["cost"] - est[WEAK]["cost"])
    book = ray.get_actor("proxray-conversations-proxray", namespace="proxray")  # shared by every ingress replica
    for _ in range(100):  # the answer does not wait for the book: wait on its state
        if ray.get(book.recall.remote("conv-1")) == STRONG:
            break
        time.sleep(0.05)
    model, rep = turn(lam)  # the models have no price: their table estimates and the margins decide
    assert model == STRONG and rep["conversation"]["action"] == "kept" and rep["conversation"]["rule"] == "table"
    assert rep["conversation"]["gain"] == pytest.approx(0.01, abs=1e-4) and rep["conversation"]["direction"] == "step down"
    alone, _ = turn(lam, cid="conv-2")  # the same turn alone goes to the cheaper model
    assert alone == WEAK
    model, rep = turn(1e6)  # far better: the conversation moves
    assert model == WEAK and rep["conversation"]["action"] == "switched"
    for _ in range(100):
        if ray.get(book.recall.remote("conv-1")) == WEAK:
            break
        time.sleep(0.05)
    res = post(server, "/v1/chat/completions", {**ask, "proxray": {"lam": 0.0, "allowed_models": [WEAK, STRONG]}},
               headers={"x-proxray-conversation": "conv-1"})  # back up: escalation beats its smaller margin
    conv = res.json()["proxray"]["conversation"]
    assert res.json()["model"] == STRONG and conv["action"] == "switched" and conv["direction"] == "escalate"
    assert res.json()["proxray"]["timings"]["conversation_ms"] > 0


def test_keys_with_their_own_policy(server):
    from openai import APIStatusError, OpenAI, PermissionDeniedError, RateLimitError

    from proxray.serve.tenancy.keys import new_key_entry

    def as_key(name):
        return OpenAI(base_url=f"{server}/v1", api_key=KEYS[name], max_retries=0, timeout=30)

    ask = dict(model="proxray", messages=[{"role": "user", "content": "Tom has 3 boxes of 4 apples. How many apples?"}],
               extra_body={"proxray": {"lam": 0.0}})
    weak = as_key("weak")
    r = weak.chat.completions.create(**ask)  # routed among the models it may use only
    assert r.model == WEAK and r.model_extra["proxray"]["key"] == {"name": "weak-only", "spent_usd": 0.0,
                                                                    "over_budget": False}
    with pytest.raises(PermissionDeniedError, match="may not use model"):
        weak.chat.completions.create(**{**ask, "model": STRONG})
    rate = as_key("rate")
    rate.chat.completions.create(**ask)
    rate.chat.completions.create(**ask)
    with pytest.raises(RateLimitError, match="2 requests a minute") as e:
        rate.chat.completions.create(**ask)
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 60
    # then refused at the door until its retry-after has passed, on every protocol: its body is not read, so a
    # malformed one (a 400 otherwise) and one over the app's 1-MiB limit (a 413 otherwise) are 429s too, and another
    # key's is not
    big = [{"role": "user", "content": "x" * (2 << 20)}]
    for path, body in (("chat/completions", {"model": "proxray", "messages": "not a list"}),
                       ("chat/completions", {"model": "proxray", "messages": big}),
                       ("completions", {"model": "proxray", "prompt": 5}),
                       ("responses", {"model": "proxray", "input": [{"type": "message", "content": 5}]}),
                       ("responses", {"model": "proxray", "input": big}),
                       ("messages", {"model": "proxray", "max_tokens": 5, "messages": "not a list"}),
                       ("messages/count_tokens", {"model": "proxray", "messages": big})):
        r = httpx.post(f"{server}/v1/{path}", json=body, timeout=30,
                       headers={"Authorization": f"Bearer {KEYS['rate']}"})
        assert r.status_code == 429 and "2 requests a minute" in r.text and int(r.headers["retry-after"]) >= 1, \
            (path, r.status_code, r.text[:300])
    r = httpx.post(f"{server}/v1/chat/completions", json={"model": "proxray", "messages": "not a list"}, timeout=30,
                   headers={"Authorization": f"Bearer {KEYS['weak']}"})
    assert r.status_code == 400 and "messages" in r.text
    spent, down = as_key("reject"), as_key("down")
    with pytest.raises(RateLimitError) as err:  # a budget no request's hold fits in: refused from the first request
        spent.chat.completions.create(**ask)
    assert "may cost up to" in str(err.value) and err.value.body["type"] == "insufficient_quota"
    r = down.chat.completions.create(**ask)  # the other key is routed to the cheapest model it may use
    assert r.model_extra["proxray"]["key"]["over_budget"]
    assert r.model == WEAK and r.model_extra["proxray"]["lam"] == 1e9
    # a key added to the file works without a restart; the single key stays unrestricted
    late = new_key_entry(KEYS["file"], "late")
    for _ in range(100):
        try:
            OpenAI(base_url=f"{server}/v1", api_key=late, max_retries=0).chat.completions.create(**ask)
            break
        except APIStatusError as err:
            assert err.status_code == 401
            time.sleep(0.1)
    else:
        pytest.fail("the new key was never accepted")
    assert OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0).chat.completions.create(
        **{**ask, "model": STRONG}).model == STRONG


def test_feedback_on_an_answer_over_http(client, server):
    """POST /v1/feedback: a score for an answer this endpoint gave (routed, by name or streamed), from any key that
    asked; an unknown id or another key's answer is a 404, a bad body a 400 naming the field."""
    from openai import OpenAI

    ask = dict(messages=[{"role": "user", "content": "Tom has 3 boxes of 4 apples. How many apples?"}])
    routed = client.chat.completions.create(model="proxray", **ask)
    by_name = client.chat.completions.create(model=WEAK, **ask)
    streamed = [c for c in client.chat.completions.create(model="proxray", stream=True, **ask)]
    weak = OpenAI(base_url=f"{server}/v1", api_key=KEYS["weak"], max_retries=0, timeout=30)
    theirs = weak.chat.completions.create(model="proxray", **ask)

    def feedback(answer_id, score, key=KEY, **extra):
        for _ in range(100):  # an answer is remembered after it is sent: wait on the book's state
            r = post(server, "/v1/feedback", {"id": answer_id, "score": score, **extra}, key=key)
            if r.status_code != 404 or answer_id == "chatcmpl-unknown":
                return r
            time.sleep(0.05)
        return r

    for answer, score in ((routed, 1.0), (by_name, 0.0), (streamed[0], 0.5)):
        r = feedback(answer.id, score, comment="checked by hand")
        assert r.status_code == 200, r.text
        assert r.json() == {"object": "feedback", "id": answer.id, "model": answer.model, "score": score,
                            "learned": False}  # no monitor in this app: counted, not learned
    assert feedback(theirs.id, 1.0, key=KEYS["weak"]).status_code == 200
    other = post(server, "/v1/feedback", {"id": theirs.id, "score": 1.0})  # another key's answer: not found
    assert other.status_code == 404 and other.json()["error"]["param"] == "id"
    unknown = feedback("chatcmpl-unknown", 1.0)
    assert unknown.status_code == 404 and "no answer" in unknown.json()["error"]["message"]
    for body, param in (({"id": routed.id, "score": 1.5}, "score"), ({"id": routed.id}, "score"),
                        ({"id": routed.id, "score": 1, "stars": 5}, "stars"), ({"score": 1}, "id")):
        bad = post(server, "/v1/feedback", body)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text
    assert post(server, "/v1/feedback", {"id": routed.id, "score": 1}, key=None).status_code == 401


def test_the_fast_encoder_routes_as_the_fitted_one_and_repeats_skip_it(client, encoder):
    """The ingress embeds with ONNX Runtime (the default backend) against a router fitted on torch
    embeddings: its estimates are the torch ones; a repeated routing text comes from the LRU."""
    from proxray.routing.registry import load_router

    text = "A train leaves at 3 pm going 60 km/h; when has it covered 150 km?"
    reports = [client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": text}],
                                              extra_body={"proxray": {"lam": 0.0}}).model_extra["proxray"]
               for _ in range(2)]
    first, second = (r["timings"] for r in reports)
    assert first["embedding_cache"] == "miss" and second["embedding_cache"] == "hit"
    assert first["encoder_batch"] == 1 and 0 <= first["encode_ms"] <= first["embed_ms"] and "encode_ms" not in second
    assert "encoder_batch" not in second and second["embed_ms"] >= 0  # the hit skipped the encoder (its speed: bench/)
    assert all(first[k] >= 0 for k in ("read_ms", "parse_ms", "estimate_ms", "model_ms"))
    router = load_router(reports[0]["router_path"])
    acc, cost = router.estimate(encoder.encode([text]))
    for r in reports:
        got = {m: e["accuracy"] for m, e in r["estimates"].items()}
        want = {m: float(acc[0, router.models_.index(m)]) for m in got}
        assert got == pytest.approx(want, abs=1e-4)
    passed = client.chat.completions.create(model=WEAK, messages=[{"role": "user", "content": text}])
    assert "embed_ms" not in passed.model_extra["proxray"]["timings"]  # nothing router-related on its path
    # concurrent new texts may share encoder passes (what arrives during one pass goes into the next; how often
    # depends on timing, so bench/bench_serve.py measures it): every pass holds 1 to 8 of them, same estimates
    texts = [f"Concurrent question {i}: what is {i} times {i + 7}?" for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        reps = list(pool.map(lambda t: client.chat.completions.create(
            model="proxray", messages=[{"role": "user", "content": t}]).model_extra["proxray"], texts))
    assert all(1 <= r["timings"]["encoder_batch"] <= len(texts) for r in reps)
    acc, _ = router.estimate(encoder.encode(texts))
    for i, r in enumerate(reps):
        got = {m: e["accuracy"] for m, e in r["estimates"].items()}
        assert got == pytest.approx({m: float(acc[i, router.models_.index(m)]) for m in got}, abs=1e-4)


def test_bypass_completions_models_and_health(client, server):
    resp = client.chat.completions.create(model=WEAK, messages=[{"role": "user", "content": "hello"}])
    assert resp.model == WEAK and resp.model_extra["proxray"]["routed"] is False
    comp = client.completions.create(model="proxray", prompt="What is 7 times 6?",
                                     extra_body={"proxray": {"allowed_models": [WEAK, STRONG]}})
    assert comp.model in (WEAK, STRONG) and comp.choices[0].text
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == "proxray" and set(ids[1:]) == {WEAK, SLOW, BROKEN, STRONG}
    assert httpx.get(f"{server}/health", timeout=10).json()["status"] == "ok"


def test_models_retrieve_and_unknown_paths_answer_like_openai(client, server):
    import openai

    m = client.models.retrieve(WEAK)  # "/" in the id: the SDK sends %2F
    assert (m.id, m.object, m.owned_by, m.model_extra["engine"]) == (WEAK, "model", "proxray", "sim")
    assert m.created == client.models.list().data[1].created > 1.7e9
    assert client.models.retrieve("proxray").model_extra["routes_to"]
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-9")
    assert e.value.body["param"] == "model" and "'gpt-9' is not served" in e.value.body["message"]
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{server}/v1/models/{WEAK}", timeout=10).status_code == 401  # the key is asked here too
    r = httpx.get(f"{server}/v1/embeddings", headers=auth, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text
    assert "/v1/embeddings" in r.json()["error"]["message"]
    assert "GET /v1/models/{model}, GET /health" in r.json()["error"]["message"]  # the app's own routes, listed
    r = httpx.get(f"{server}/v1/chat/completions", headers=auth, timeout=10)
    assert r.status_code == 405 and "GET is not allowed" in r.json()["error"]["message"], r.text
    assert r.headers["allow"] == "POST"


def test_docs_and_cors_as_configured(server):
    """This app has docs: true and cors_origins: [ORIGIN] (tests/test_gateway.py checks both off by default)."""
    spec = httpx.get(f"{server}/openapi.json", timeout=10).json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health"} <= set(spec["paths"])
    assert "swagger" in httpx.get(f"{server}/docs", timeout=10).text.lower()
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
    pre = httpx.options(f"{server}/v1/chat/completions", headers={"Origin": ORIGIN, **ask}, timeout=10)
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN, pre.headers
    assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    other = httpx.options(f"{server}/v1/chat/completions", headers={"Origin": "https://elsewhere.example", **ask},
                          timeout=10)
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    body = {"model": "proxray", "messages": [{"role": "user", "content": "hi"}], "proxray": {"allowed_models": [WEAK]}}
    r = post(server, "/v1/chat/completions", body, headers={"Origin": ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    assert "x-proxray-model" in r.headers["access-control-expose-headers"]
    assert r.headers["x-request-id"] and r.headers["x-proxray-model"] == WEAK  # what the page may read
    assert post(server, "/v1/chat/completions", body, key=None, headers={"Origin": ORIGIN}).status_code == 401  # key still asked


def test_streaming_matches_the_full_answer(client):
    kw = dict(model=STRONG, messages=[{"role": "user", "content": "Name a planet."}], seed=3)
    full = client.chat.completions.create(**kw).choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)]
    assert len(parts) > 2 and "".join(parts) == full


def test_fallback_when_the_chosen_model_fails(client):
    resp = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": "Is the sky blue?"}],
                                          extra_body={"proxray": {"lam": 0.0}})
    rep = resp.model_extra["proxray"]
    assert rep["fallback_from"] == [BROKEN]  # the router's favourite is broken: nobody is left unanswered
    assert resp.model != BROKEN and "injected failure" in rep["failures"][0]["error"]


@pytest.mark.parametrize("body,raw,status,fragment", [
    (None, b"{not json", 400, "not valid JSON"),
    ({"model": "proxray", "messages": []}, None, 400, "messages"),
    ({"model": "proxray", "messages": [{"role": "user", "content": "  "}]}, None, 400, "non-empty text"),
    ({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, None, 404, "'gpt-9' is not served"),
    ({"model": "proxray", "messages": [{"role": "user", "content": "hi"}], "proxray": {"lam": -1}}, None, 400, "proxray.lam"),
    ({"model": "proxray", "messages": [{"role": "user", "content": "x" * 3000}]}, None, 413, "limit is 2000"),
    ({"model": "proxray", "messages": [{"role": "user", "content": "hi"}], "proxray": {"allowed_models": ["nope"]}}, None, 400, "not routable"),
    ({"model": "proxray", "messages": [{"role": "user", "content": "hi"}], "proxray": {"max_cost": 0}}, None, 400, "max_cost"),
    ({"model": "proxray", "messages": [{"role": "wizard", "content": "hi"}]}, None, 400, "messages.0.role"),
    ({"model": "proxray", "prompt": ["a", "b"]}, None, 400, "exactly one prompt"),
])
def test_bad_input_gets_a_4xx_naming_the_problem(server, body, raw, status, fragment):
    path = "/v1/completions" if body and "prompt" in body else "/v1/chat/completions"
    r = post(server, path, body, raw=raw)
    assert r.status_code == status, r.text
    assert fragment in r.json()["error"]["message"]
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200  # and the server stays up


def test_api_key_is_required(server):
    body = {"model": WEAK, "messages": [{"role": "user", "content": "hi"}]}
    assert post(server, "/v1/chat/completions", body, key=None).status_code == 401
    assert post(server, "/v1/chat/completions", body, key="sk-wrong").status_code == 401
    assert httpx.get(f"{server}/v1/models", timeout=10).status_code == 401
    assert post(server, "/v1/chat/completions", body).status_code == 200


def test_routed_load_autoscales_one_model_up_and_down(server):
    from ray import serve

    from proxray.serve.app import deployment_name

    name = deployment_name(SLOW)

    def replicas():
        st = serve.status().applications["proxray"].deployments[name]
        return st.replica_states.get("RUNNING", 0)

    body = {"model": "proxray", "messages": [{"role": "user", "content": "Route me to the slow one."}],
            "proxray": {"allowed_models": [SLOW]}}
    assert replicas() == 1
    peak, deadline = 1, time.time() + 25
    with ThreadPoolExecutor(8) as pool:
        while time.time() < deadline and peak < 2:
            codes = list(pool.map(lambda _: post(server, "/v1/chat/completions", body).status_code, range(16)))
            assert codes == [200] * 16
            peak = max(peak, replicas())
    assert peak >= 2, "routed load did not scale the model up"
    deadline = time.time() + 30
    while time.time() < deadline and replicas() > 1:
        time.sleep(1)
    assert replicas() == 1, "the model did not scale back down"
