"""The gateway's transport-free pieces: what the router reads, what the model is sent, the routing plan's
order, the JSON limits, what a CPU engine refuses, what a client may see of a failure. Fast; no Ray."""
import json

import numpy as np
import pytest

from proxray.routing.objective import choose
from proxray.common.secrets import scrub
from proxray.serve.deployments.client import ModelError
from proxray.serve.deployments.models import refused_parameters
from proxray.serve.errors import RequestError
from proxray.serve.protocols.base import RoutingOptions
from proxray.serve.protocols.chat import ChatRequest, CompletionRequest, routing_text
from proxray.serve.request.http import MAX_DEPTH, parse_json
from proxray.serve.request.plan import candidate_order, pass_through, routed

CONV = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer", "name": "bot"},
        {"role": "tool", "content": "tool output", "tool_call_id": "c1"},
        {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "image_url", "image_url": {"url": "x"}},
                                     {"type": "text", "text": "question"}]}]


@pytest.mark.parametrize("policy,expected", [
    ("system+last_user", "Be brief.\nsecond\nquestion"),
    ("last_user", "second\nquestion"),
    ("all_user", "first question\nsecond\nquestion"),
    ("all", "Be brief.\nfirst question\nfirst answer\ntool output\nsecond\nquestion"),
])
def test_routing_text_reads_what_the_policy_says_and_text_parts_only(policy, expected):
    assert routing_text(ChatRequest(model="proxray", messages=CONV), policy) == expected


def test_the_model_gets_the_request_as_sent_with_only_the_model_rewritten():
    raw = {"model": "proxray", "messages": CONV, "n": 2, "stop": ["\n"], "tools": [{"type": "function"}],
           "response_format": {"type": "json_object"}, "logprobs": True, "max_completion_tokens": 9,
           "some_vendor_extra": {"a": 1}, "proxray": {"lam": 3.0}}
    body = ChatRequest.model_validate(raw).forward("m1", default_max_tokens=256)
    assert body == {**{k: v for k, v in raw.items() if k != "proxray"}, "model": "m1"}
    # no token limit at all: the app's default is the one addition
    bare = ChatRequest.model_validate({"model": "proxray", "messages": CONV}).forward("m1", 256)
    assert bare == {"model": "m1", "messages": CONV, "max_tokens": 256}
    comp = CompletionRequest.model_validate({"model": "m1", "prompt": ["hi"], "echo": False}).forward("m1", 5)
    assert comp == {"model": "m1", "prompt": ["hi"], "echo": False, "max_tokens": 5}


def test_candidate_order_is_routers_choose_applied_again_and_again():
    rng = np.random.default_rng(0)
    for _ in range(50):
        acc, cost = rng.uniform(size=6).round(1), rng.uniform(size=6).round(1)  # rounding makes ties
        allowed = rng.uniform(size=6) < 0.8
        allowed[0] = True
        lam = float(rng.uniform(0, 2))
        order, left = candidate_order(acc, cost, lam, allowed), allowed.copy()
        for i in order:
            assert i == choose(acc[None], cost[None], lam, left[None])[0]
            left[i] = False
        assert sorted(order) == list(np.flatnonzero(allowed))


def test_plan_errors_name_the_option():
    models, served = ["a", "b", "c"], {"a": 1, "b": 1}
    acc, cost = np.array([0.5, 0.9, 1.0]), np.array([1.0, 2.0, 0.1])
    p = routed(models, served, acc, cost, 0.3, 0.0, RoutingOptions(), "r")
    assert p.candidates == ["b", "a"] and p.report["runner_up"] == "a"  # c is not served
    with pytest.raises(RequestError, match="proxray.allowed_models") as e:
        routed(models, served, acc, cost, 0.3, 0.0, RoutingOptions(allowed_models=["c"]), "r")
    assert e.value.status == 400
    with pytest.raises(RequestError, match="cheapest: 1 USD"):
        routed(models, served, acc, cost, 0.3, 0.0, RoutingOptions(max_cost=0.5), "r")
    with pytest.raises(RequestError) as e:
        pass_through("zz", served)
    assert e.value.status == 404 and e.value.param == "model"


@pytest.mark.parametrize("raw,fragment", [
    (b"{" * 2, "not valid JSON"),
    (b'{"a": ' + b"1" * 5000 + b"}", "not valid JSON"),
    (b'{"a": ' + b"1" * 25 + b"}", "64 bits"),
    (b'{"a": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}", "nested deeper"),
    (b"[" * 200_000 + b"]" * 200_000, "nested deeper"),
    (b"[1, 2]", "JSON object"),
    (b"\xff\xfe", "not valid JSON"),
])
def test_json_limits(raw, fragment):
    with pytest.raises(RequestError, match=fragment) as e:
        parse_json(raw)
    assert e.value.status == 400
    assert parse_json(json.dumps({"a": [[1, 2**62]], "b": True}).encode())["b"] is True


def test_cpu_engines_refuse_what_they_cannot_honour_and_accept_not_asked():
    asked = {"model": "m", "messages": [], "tools": [{}], "response_format": {"type": "json_object"},
             "logprobs": True, "presence_penalty": 0.5, "frobnicate": 1}
    assert refused_parameters(asked) == ["frobnicate", "logprobs", "presence_penalty", "response_format", "tools"]
    not_asked = {"model": "m", "messages": [], "tools": None, "response_format": {"type": "text"}, "logprobs": False,
                 "presence_penalty": 0, "tool_choice": "none", "n": 2, "stop": "x", "stream_options": {"include_usage": True}}
    assert refused_parameters(not_asked) == []


def test_what_a_client_sees_of_a_failure():
    assert scrub("FileNotFoundError: /home/u/models/x/config.json missing\n  Traceback ...", local=True) == \
        "FileNotFoundError: <path> missing"
    assert scrub("model meta-llama/Llama-3.2-1B failed", local=True) == "model meta-llama/Llama-3.2-1B failed"
    e = ModelError({"error": {"message": "too long", "type": "BadRequestError", "code": 400}})
    assert e.status == 400 and not e.falls_back
    assert ModelError({"error": {"message": "busy", "code": 503}}).falls_back


def test_the_plan_leaves_out_models_that_cannot_honour_the_request():
    models, served = ["a", "b", "c"], {"a": 1, "b": 1, "c": 1}
    acc, cost = np.array([0.9, 0.5, 0.7]), np.array([1.0, 1.0, 1.0])
    p = routed(models, served, acc, cost, 0.1, 0.0, RoutingOptions(), "r", refusals={"a": ["tools"], "b": [], "c": []})
    assert p.candidates == ["c", "b"] and p.report["excluded"] == {"a": ["tools"]}
    with pytest.raises(RequestError, match="no routable model honours: response_format, tools") as e:
        routed(models, served, acc, cost, 0.1, 0.0, RoutingOptions(allowed_models=["a", "b"]), "r",
               refusals={"a": ["tools"], "b": ["response_format"], "c": []})
    assert e.value.status == 400 and e.value.param == "response_format"


def test_api_key_comes_from_a_file_or_an_env_var_never_silently_from_nothing(tmp_path, monkeypatch):
    from proxray.serve.config import AppArgs, load_api_key

    base = {"router": "r", "models": [{"id": "m", "engine": "sim"}]}
    key_file = tmp_path / "api_key"
    key_file.write_text("s3cret-key\n")
    assert load_api_key(AppArgs.model_validate({**base, "api_key_file": str(key_file)})) == b"s3cret-key"
    monkeypatch.setenv("PROXRAY_TEST_KEY", "from-env")
    assert load_api_key(AppArgs.model_validate({**base, "api_key_env": "PROXRAY_TEST_KEY"})) == b"from-env"
    assert load_api_key(AppArgs.model_validate(base)) == b""
    key_file.write_text("\n")
    with pytest.raises(ValueError, match="api_key_file=.* is empty"):
        load_api_key(AppArgs.model_validate({**base, "api_key_file": str(key_file)}))
    with pytest.raises(ValueError, match="cannot read it"):
        load_api_key(AppArgs.model_validate({**base, "api_key_file": str(tmp_path / "none")}))
    with pytest.raises(ValueError, match="give one of them, not both"):
        AppArgs.model_validate({**base, "api_key_file": str(key_file), "api_key_env": "X"})


def test_encoder_batcher_forms_the_next_pass_from_everything_queued_while_the_encoder_was_busy():
    """Ray's @serve.batch formed batches on arrival (mean 1.3 under load); this one takes what arrived
    during the previous pass. Errors reach every waiter of their pass; a cancelled waiter is skipped."""
    import asyncio
    import threading

    from proxray.serve.request.encoding import EncoderBatcher

    passes, gate = [], threading.Event()

    def encode(texts):
        passes.append(list(texts))
        if len(passes) == 1:
            gate.wait(5)  # the first pass holds the encoder while the others queue up
        if "boom" in texts:
            raise RuntimeError("encoder failed")
        return np.array([[float(len(t))] for t in texts])

    async def main():
        b = EncoderBatcher(encode, max_batch=3)
        first = asyncio.create_task(b.encode("a"))
        await asyncio.sleep(0.05)
        assert b.busy and passes == [["a"]]
        rest = [asyncio.create_task(b.encode(t)) for t in ("bb", "ccc", "dddd", "eeeee")]
        gone = asyncio.create_task(b.encode("cancelled"))
        await asyncio.sleep(0.01)
        gone.cancel()
        gate.set()
        out = [await first] + [await r for r in rest]
        assert [float(v[0]) for v, _, _ in out] == [1, 2, 3, 4, 5]  # each caller gets its own text's vector
        assert [n for _, n, _ in out] == [1, 3, 3, 3, 1] and all(ms >= 0 for _, _, ms in out)
        assert passes == [["a"], ["bb", "ccc", "dddd"], ["eeeee"]]  # capped at max_batch, cancelled one skipped
        assert not b.busy
        bad = [asyncio.create_task(b.encode(t)) for t in ("boom", "x")]
        for r in bad:
            with pytest.raises(RuntimeError, match="encoder failed"):
                await r
        v, n, _ = await b.encode("ok")  # the batcher goes on after a failed pass
        assert float(v[0]) == 2 and n == 1

    asyncio.run(main())
    with pytest.raises(ValueError, match="max_batch=0"):
        EncoderBatcher(encode, max_batch=0)


def test_an_endpoint_model_has_no_deployment_fields():
    from proxray.pool.spec import PoolModel
    from proxray.serve.preflight import relay_problems

    ext = {"id": "frontier", "engine": "openai", "base_url": "http://127.0.0.1:9/v1"}
    assert relay_problems([PoolModel(**ext, max_ongoing_requests=16)]) == []  # its cap per router replica
    problems = relay_problems([PoolModel(**ext, autoscaling={"max_replicas": 4}, num_cpus=1),
                               PoolModel(id="meta-llama/Llama-3.2-1B-Instruct", engine="sim", num_cpus=1)])
    assert [p.split(": ")[2] for p in problems] == ["autoscaling", "num_cpus"]
    assert all("relayed by the router's replicas" in p for p in problems)


class Quiet:
    """ray.util.metrics' Counter and Histogram stand-in: no Ray needed to count (``n``: how many were recorded)."""

    def __init__(self, *a, **k):
        self.n = 0

    def inc(self, *a):
        self.n += 1

    observe = inc


def quiet_metrics(monkeypatch) -> None:
    import ray.util.metrics

    monkeypatch.setattr(ray.util.metrics, "Counter", Quiet)
    monkeypatch.setattr(ray.util.metrics, "Histogram", Quiet)


def test_a_relay_past_its_cap_answers_429_at_once(monkeypatch):
    """An endpoint's relay with every slot taken answers 429 (the gateway falls back) without calling the endpoint."""
    import asyncio

    from proxray.serve.deployments.endpoint_server import EndpointRelay

    quiet_metrics(monkeypatch)
    relay = EndpointRelay({"id": "frontier", "engine": "openai", "base_url": "http://127.0.0.1:9/v1",
                           "max_ongoing_requests": 1})

    async def go():
        async with relay.slots:  # one request in flight
            return [obj async for obj in relay.respond("chat", {"messages": [{"role": "user", "content": "hi"}]})]

    (obj,) = asyncio.run(go())
    assert obj["error"]["code"] == 429 and "1 requests in flight" in obj["error"]["message"]
    assert relay.limited.n == 1


def test_an_endpoints_unsupported_parameter_is_a_refusal_a_routed_request_passes_over(monkeypatch):
    """OpenAI's ``code: unsupported_parameter`` on a 400 marks the relay's error as a model's refusal of that parameter
    (``ModelError.unsupported``); another 400, or one naming no parameter, stays the request's own."""
    from proxray.serve.deployments.client import ModelError
    from proxray.serve.deployments.endpoint_server import EndpointRelay

    quiet_metrics(monkeypatch)
    relay = EndpointRelay({"id": "frontier", "engine": "openai", "base_url": "http://127.0.0.1:9/v1"})
    said = {"error": {"message": "Unsupported parameter: 'temperature'", "type": "invalid_request_error",
                      "param": "temperature", "code": "unsupported_parameter"}}
    assert ModelError(relay._error(400, json.dumps(said))).unsupported == "temperature"
    assert ModelError(relay._error(400, json.dumps({"error": {**said["error"], "code": None}}))).unsupported is None
    assert ModelError(relay._error(400, json.dumps({"error": {**said["error"], "param": None}}))).unsupported is None
    assert ModelError(relay._error(422, json.dumps(said))).unsupported is None


def test_the_conversation_book_is_bounded_and_forgets_idle_conversations():
    from proxray.serve.tenancy.conversations import ConversationBook

    book = ConversationBook(max_entries=2, ttl_s=60)
    book.remember("a", "m1", now=0)
    book.remember("b", "m2", now=10)
    assert book.recall("a", now=59) == "m1" and book.recall("a", now=61) is None  # idle past ttl_s
    book.remember("c", "m3", now=70)
    book.remember("d", "m1", now=71)  # over max_entries: the least recently remembered goes
    assert book.recall("b", now=72) is None and book.recall("c", now=72) == "m3"
    assert book.stats() == {"conversations": 2, "dropped": 1, "keys": {}}


def test_a_key_that_opens_conversations_without_end_drops_its_own_not_another_keys():
    """The book of 100 conversations, a key's share a quarter of it: key B's 10 conversations, then key A's 1,000 —
    A keeps its 25 most recent, B keeps all 10 (a plain LRU would have dropped B's first); entries without a key
    (the single key's) are bounded by the book alone."""
    from proxray.serve.tenancy.conversations import ConversationBook, ConversationClient

    book = ConversationBook(max_entries=100, ttl_s=3600, key_share=0.25)
    for i in range(10):
        book.remember(ConversationClient.entry(f"b{i}", "B"), "m1", now=i)
    for i in range(1000):
        book.remember(ConversationClient.entry(f"a{i}", "A"), "m2", now=100 + i)
    assert all(book.recall(ConversationClient.entry(f"b{i}", "B"), now=2000) == "m1" for i in range(10))
    kept = [i for i in range(1000) if book.recall(ConversationClient.entry(f"a{i}", "A"), now=2000)]
    assert kept == list(range(975, 1000)) and book.stats()["keys"] == {"A": 25, "B": 10}
    book.remember(ConversationClient.entry("a975", "A"), "m1", now=2001)  # a turn of a kept one: refreshed, not added
    assert book.stats()["keys"]["A"] == 25 and book.recall(ConversationClient.entry("a976", "A"), now=2002) == "m2"
    for i in range(200):  # the single key's conversations: the book's bound, least recently used first, takes keys' too
        book.remember(ConversationClient.entry(f"s{i}", None), "m3", now=3000 + i)
    assert len(book.entries) == 100 and book.stats()["keys"] == {}  # the keys' entries dropped are forgotten too


@pytest.mark.parametrize("acc,cost,lam,expect", [
    ([0.80, 0.81], [1.0, 1.0], 0.0, ("kept", "escalate")),       # better by 0.01 < escalate margin 0.02
    ([0.80, 0.85], [1.0, 1.0], 0.0, ("switched", "escalate")),   # better by 0.05 > 0.02
    ([0.80, 0.77], [3.0, 0.0], 0.01, ("kept", "step down")),     # a cheaper model better by 0.0 - 0.04: no
    ([0.80, 0.78], [10.0, 0.0], 0.01, ("switched", "step down")),  # 0.78 vs 0.70: better by 0.08 > 0.05
    ([0.80, 0.76], [5.0, 0.0], 0.01, ("kept", "step down")),     # 0.76 vs 0.75: 0.01 < step-down margin 0.05
])
def test_a_conversation_keeps_its_model_within_the_margins(acc, cost, lam, expect):
    from proxray.serve.config import ConversationSpec
    from proxray.serve.tenancy.conversations import keep

    models = ["held", "other"]
    obj = np.array(acc) - lam * np.array(cost)
    candidates = [models[i] for i in np.argsort(-obj, kind="stable")]
    if candidates[0] == "held":
        candidates = ["other", "held"]  # the router prefers the other model (the cases are built so)
    report = keep(candidates, "held", acc, cost, lam, models, ConversationSpec())
    assert (report["action"], report["direction"]) == expect
    assert candidates[0] == ("held" if expect[0] == "kept" else "other")
    assert keep(["other", "held"], None, acc, cost, lam, models, ConversationSpec())["action"] == "new"
    assert keep(["other"], "held", acc, cost, lam, models, ConversationSpec())["action"] == "new"  # not a candidate


def test_the_answer_book_is_bounded_expires_and_answers_only_the_key_that_asked():
    from proxray.serve.tenancy.feedback import AnswerBook, FeedbackRequest

    book = AnswerBook(max_answers=3, retention_s=100.0, key_share=1.0)
    for i in range(4):
        book.remember(f"a{i}", {"text": f"q{i}", "model": "m", "key": "team" if i else None, "cost": 0.0}, now=10.0 * i)
    # past the book's bound, the key that holds the most loses its oldest: team's a1, not the other key's a0
    assert book.find("a1", "team", now=35.0) is None and book.stats() == {"answers": 3, "dropped": 1}
    assert book.find("a0", None, now=35.0)["text"] == "q0" and book.find("a2", "team", now=35.0)["text"] == "q2"
    assert book.find("a2", None, now=35.0) is None and book.find("a2", "other", now=35.0) is None  # another key's
    assert book.find("a0", None, now=111.0) is None and book.find("a3", "team", now=111.0) is not None  # expired
    # an id that repeats under another key is another entry: it overwrites nothing
    book.remember("a3", {"text": "mine", "model": "m", "key": "other", "cost": 0.0}, now=111.0)
    assert book.find("a3", "team", now=111.0)["text"] == "q3" and book.find("a3", "other", now=111.0)["text"] == "mine"
    # a record larger than its key's share alone is refused, and nothing of the key's is dropped for it
    small = AnswerBook(max_answers=10, max_bytes=2**20, key_share=0.5)
    assert small.remember("x", {"text": "q", "model": "m", "key": "k", "cost": 0.0})
    assert not small.remember("y", {"text": "q" * 2**20, "model": "m", "key": "k", "cost": 0.0})
    assert small.find("x", "k") is not None and small.find("y", "k") is None
    with pytest.raises(ValueError, match="score"):
        FeedbackRequest.model_validate({"id": "a1", "score": float("nan")})


def test_answers_are_remembered_in_batches_and_feedback_finds_one_still_in_its_batch():
    """A replica's remembered answers reach the answer book in one call a batch (``later``), and feedback on an answer
    given a moment before — its record still in the batch — finds it rather than a 404."""
    import asyncio
    import types

    from proxray.serve.tenancy.feedback import AnswerBook, FeedbackClient, FeedbackRequest

    book, calls = AnswerBook(), []

    class InProcess(FeedbackClient):
        async def call(self, method, *args, **_):
            calls.append(method)
            return getattr(book, method)(*args)

    spec = types.SimpleNamespace(enabled=True, retention_s=86400.0)
    client = InProcess("app", spec)
    metrics = types.SimpleNamespace(feedback=lambda *a: None)

    async def main():
        for i in range(50):
            client.recorder(f"a{i}", f"q{i}", "m", "team", None, 0.0)(None)
        found = await client.take(FeedbackRequest(id="a49", score=1.0), "team", metrics, None)
        with pytest.raises(RequestError) as missing:
            await client.take(FeedbackRequest(id="nope", score=1.0), "team", metrics, None)
        return found, missing.value.status

    found, status = asyncio.run(main())
    assert found["model"] == "m" and status == 404
    assert calls.count("many") == 1 and book.stats()["answers"] == 50, calls


def test_a_refused_request_books_nothing_so_the_limiter_recovers_after_overload():
    """Overloaded 3x for 20 s (3 requests a second at 60 a minute), then, 10 s later, a quarter of the limit: every
    one of those is let through at once. A refusal takes no slot."""
    from proxray.pool.openai_engine import RateLimiter

    lim, max_wait = RateLimiter(60, None), 10.0
    admitted = sum(lim.reserve(100, max_wait, now=i / 3) is not None for i in range(60))  # t = 0 .. 20 s
    assert admitted == 30  # a slot a second up to 10 s past the burst (the longest a request may wait)
    waits = [lim.reserve(100, max_wait, now=30.0 + 4 * i) for i in range(10)]  # 15 a minute, from t = 30 s
    assert waits == [0.0] * 10


def test_a_refused_request_books_no_tokens():
    """tokens_per_minute is a sliding minute: past it, a request waits for the oldest tokens to leave the minute, or
    is refused without reserving any; when the minute has passed, requests go at once."""
    from proxray.pool.openai_engine import RateLimiter

    lim = RateLimiter(None, 1000)
    assert [lim.reserve(400, 5.0, now=t) for t in (0.0, 1.0)] == [0.0, 0.0]
    booked = list(lim.spent)
    assert lim.reserve(400, 5.0, now=2.0) is None and lim.spent == booked  # would wait 58 s: refused, nothing kept
    assert lim.reserve(100, 5.0, now=3.0) == 0.0  # what still fits in the minute goes
    assert lim.reserve(400, 60.0, now=4.0) == pytest.approx(56.0)  # a caller that may wait is given its time
    assert [lim.reserve(200, 5.0, now=130.0 + 16 * i) for i in range(5)] == [0.0] * 5


def test_start_times_are_moments_so_answers_that_arrive_late_do_not_send_together(monkeypatch):
    """Five reservations 10 ms apart at 600 a minute: the moments they may start are 0.1 s apart from the first, and a
    caller that got its answer late (here: all of them at once, 1 s on) still sends on those moments, where sleeping
    the waits from the answer's arrival would have sent the first at once with the others each 0.1 s after the last."""
    import proxray.pool.openai_engine as oe

    clock = iter(100.0 + 0.01 * i for i in range(6))
    monkeypatch.setattr(oe.time, "time", lambda: next(clock))
    lim = oe.RateLimiter(600, None)
    starts = [lim.start_at(10) for _ in range(5)]
    assert starts == pytest.approx([100.0, 100.1, 100.2, 100.3, 100.4])
    assert lim.start_at(10, max_wait=0.0, limits=(600, None)) is None  # past its wait: refused, as reserve refuses


def test_retry_waits_honour_retry_after_else_back_off():
    from proxray.pool.upstream import retry_wait

    assert retry_wait(0, "0.2") == 0.2 and retry_wait(3, "7") == 7.0
    assert all(0.25 <= retry_wait(0, None) <= 0.75 for _ in range(50))
    assert all(2.0 <= retry_wait(3, "soon") <= 6.0 for _ in range(50))  # not a number: the backoff


def test_one_keys_answers_cannot_push_out_anothers_and_bytes_are_bounded():
    """A key floods the book with long texts: it drops its own oldest answers past its share, never another key's;
    the book's bytes stay under max_bytes, counted as Python holds the text (4 bytes a character for an emoji text)."""
    from proxray.serve.tenancy.feedback import RECORD_BYTES, AnswerBook

    book = AnswerBook(max_answers=1000, retention_s=1e9, max_bytes=2**20, key_share=0.5)
    book.remember("theirs", {"text": "a short question", "model": "m", "key": "quiet", "cost": 0.0}, now=0.0)
    for i in range(200):
        book.remember(f"flood{i}", {"text": "\U0001F600" * 8000, "model": "m", "key": "loud", "cost": 0.0}, now=1.0 + i)
    use = book.usage()
    assert book.find("theirs", "quiet", now=300.0) is not None
    assert use["keys"]["loud"] <= 2**19 and use["bytes"] <= 2**20
    assert len(book.by_key["loud"]) == (2**19) // (32_076 + RECORD_BYTES)  # 8,000 emoji: 32,000 bytes and a header
    assert book.find("flood199", "loud", now=300.0) is not None and book.find("flood0", "loud", now=300.0) is None


def test_a_redeploy_with_smaller_bounds_trims_the_shared_books():
    """Every replica tells a shared book the app's settings when it first finds it: an app redeployed with smaller
    bounds trims the book the earlier deployment created, instead of keeping its settings."""
    from proxray.serve.tenancy.conversations import ConversationBook
    from proxray.serve.tenancy.feedback import AnswerBook

    convs = ConversationBook(max_entries=10)
    for i in range(10):
        convs.remember(f"c{i}", "m", now=float(i))
    convs.configure(4, 60.0)
    assert list(convs.entries) == ["c6", "c7", "c8", "c9"] and convs.ttl_s == 60.0
    book = AnswerBook(max_answers=10, key_share=1.0)
    for i in range(10):
        book.remember(f"a{i}", {"text": "q", "model": "m", "key": "k", "cost": 0.0}, now=float(i))
    book.configure(10, 100.0, 2**20, 0.3)
    assert list(book.answers) == [("k", "a7"), ("k", "a8"), ("k", "a9")] and book.retention_s == 100.0


def test_a_relayed_answers_rate_limit_booking_is_corrected_to_what_it_used(monkeypatch, tmp_path):
    """The endpoint's shared limiter books a request's bound (its body as prompt, its max_tokens) before it is sent;
    once the answer's usage arrives — whole, streamed in chat's words, a Messages stream's first and last events — the
    booking is corrected to the tokens the endpoint reported, so a large max_tokens does not keep the limit spent."""
    import asyncio

    from openai_standin import MODEL, StandIn, key_file
    from proxray.serve.deployments.endpoint_server import EndpointRelay, usage_in
    from proxray.pool.openai_engine import RateLimiter

    quiet_metrics(monkeypatch)
    key, path = key_file(tmp_path)
    standin = StandIn(key, faults=False)
    try:
        relay = EndpointRelay({"id": "frontier", "engine": "openai", "source": MODEL, "base_url": standin.url,
                               "api_key_file": str(path), "rate_limit": {"tokens_per_minute": 100000}})
        limiter = RateLimiter(None, 100000)

        class Local:  # the limiter actor's calls, in process
            tpm = 100000

            async def reserve(self, tokens, max_wait):
                return limiter.reserve(tokens, max_wait)

            def correct(self, reserved, used):
                if used is not None and used != reserved:
                    limiter.correct(reserved, used)

        relay.limiter = Local()
        body = {"messages": [{"role": "user", "content": "What is six times seven?"}], "max_tokens": 30000}

        async def go(stream):
            b = {**body, "stream": True, "stream_options": {"include_usage": True}} if stream else body
            return [obj async for obj in relay.respond("chat", b)]

        for stream in (False, True):
            asyncio.run(go(stream))
        booked = [n for _, n in limiter.spent]
        assert len(booked) == 2 and max(booked) < 100, booked  # corrected from > 30,000 to the few tokens used
    finally:
        standin.stop()
    events = [{"type": "message_start", "message": {"usage": {"input_tokens": 1000, "cache_read_input_tokens": 500,
                                                              "output_tokens": 1}}},
              {"type": "content_block_delta"}, {"type": "message_delta", "usage": {"output_tokens": 40}}]
    seen = None
    for e in events:
        seen = usage_in(e, seen)
    assert (seen.prompt, seen.output) == (1500, 40)
    assert usage_in({"input_tokens": 77}, None).prompt == 77  # a count's answer


def test_a_stream_its_client_leaves_is_read_on_for_its_usage_until_its_deadline():
    """``Pumped``: the client takes the first event and goes; what the model still sends is read (the usage at its
    end counted), and the stream's end reported once. Past the deadline a stream that never ends is cancelled."""
    import asyncio
    import time

    from proxray.serve.request.sse import PUMPS, relay

    class Fmt:
        end = "data: [DONE]\n\n"

        @staticmethod
        def event(obj):
            return json.dumps(obj)

        @staticmethod
        def error(body):
            return json.dumps(body)

    async def model(n, hang=False):
        for i in range(n):
            await asyncio.sleep(0.01)
            yield {"i": i}
        if hang:
            await asyncio.sleep(3600)
        yield {"usage": {"prompt_tokens": 7, "completion_tokens": n}}

    async def leave_after_first(n, until, hang=False):
        from proxray.serve.request.sse import Pumped

        seen, done = [], []
        events = relay([], Pumped(model(n, hang), until), Fmt, on_done=done.append, on_chunk=seen.append)
        first = await events.__anext__()
        await events.aclose()  # the client is gone
        for _ in range(300):
            if done:
                break
            await asyncio.sleep(0.01)
        return first, seen, done

    first, seen, done = asyncio.run(leave_after_first(20, time.monotonic() + 30))
    assert json.loads(first) == {"i": 0} and done == [True]
    assert seen[-1] == {"usage": {"prompt_tokens": 7, "completion_tokens": 20}} and len(seen) == 21
    first, seen, done = asyncio.run(leave_after_first(3, time.monotonic() + 0.3, hang=True))
    assert done == [True] and not any("usage" in s for s in seen)  # cut at its deadline: charged without usage
    assert not PUMPS


def test_the_rate_limiter_books_as_the_minute_scan_does(rng):
    """The limiter's sorted bookings and running total give the waits a scan of the last minute's bookings gives
    (the rule as first written, kept here as the reference, with its window read as ``t + 60 > start``: written as
    ``t > start - 60`` it could loop for ever on a start equal to a booking's end in floating point), over a seeded
    stream of reservations and corrections."""
    from proxray.pool.openai_engine import RateLimiter

    class Scan:
        def __init__(self, rpm, tpm):
            self.interval, self.tpm, self.next_start, self.spent = (60.0 / rpm if rpm else 0.0), tpm, 0.0, []

        def reserve(self, tokens, max_wait, now):
            self.spent = [(t, n) for t, n in self.spent if t + 60.0 > now]
            start = max(now, self.next_start)
            tokens = min(tokens, self.tpm)
            while sum(n for t, n in self.spent if t + 60.0 > start) + tokens > self.tpm:
                start = max(start, min(t for t, _ in self.spent if t + 60.0 > start) + 60.0)
            if max_wait is not None and start - now > max_wait:
                return None
            self.spent.append((start, tokens))
            self.next_start = start + self.interval
            return start - now

        def correct(self, reserved, used):
            for i in range(len(self.spent) - 1, -1, -1):
                if self.spent[i][1] == reserved:
                    self.spent[i] = (self.spent[i][0], used)
                    return

    for rpm in (None, 600):
        fast, ref, now = RateLimiter(rpm, 20000), Scan(rpm, 20000), 1000.0
        for _ in range(1500):  # ~24,000 tokens a minute offered: some wait, some are refused
            now += float(rng.exponential(1.0))
            tokens, wait = int(rng.integers(1, 800)), (None if rng.uniform() < 0.3 else float(rng.uniform(0, 30)))
            got, want = fast.reserve(tokens, wait, now), ref.reserve(tokens, wait, now)
            assert (got is None) == (want is None) and (got is None or abs(got - want) < 1e-9)
            if got is not None and rng.uniform() < 0.3:
                used = int(rng.integers(1, 800))
                fast.correct(tokens, used), ref.correct(tokens, used)
        assert fast.total == sum(n for _, n in fast.spent)


def test_a_relayed_request_reached_its_endpoint_only_once_its_headers_went_out(monkeypatch):
    """What a 504 is charged on: a request still waiting for a connection to an endpoint that never accepts it (a
    listening socket whose queue is full) has not reached it; one whose endpoint read it and never answered has. The
    key's hold is released for the first and charged for the second (``Held.refused``)."""
    import asyncio
    import socket
    import threading

    from proxray.serve.deployments.endpoint_server import EndpointRelay
    from proxray.serve.wire import REACHED, Reached

    quiet_metrics(monkeypatch)
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    fillers = []
    for _ in range(4):  # the accept queue filled: later connections wait in SYN-SENT
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(full.getsockname())
        fillers.append(c)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    taken = []
    threading.Thread(target=lambda: taken.append(silent.accept()), daemon=True).start()  # reads nothing, answers never

    def sent_within(port, seconds=1.5):
        relay = EndpointRelay({"id": "frontier", "engine": "openai", "base_url": f"http://127.0.0.1:{port}/v1",
                               "timeout_s": 20})

        async def go():
            mark = Reached()
            REACHED.set(mark)

            async def drain():
                async for _ in relay.respond("/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}):
                    pass

            try:
                await asyncio.wait_for(drain(), seconds)  # the gateway's deadline, as a 504 ends it
            except asyncio.TimeoutError:
                pass
            return mark.model

        return asyncio.run(go())

    try:
        assert sent_within(full.getsockname()[1]) is None
        assert sent_within(silent.getsockname()[1]) == "frontier"
    finally:
        for s in (full, silent, *fillers, *(c for c, _ in taken)):
            s.close()


def test_a_keys_report_coarsens_distances_to_other_keys_references_and_shows_its_own_budget():
    """What a key of the keys file is shown: the outlier score and the evidence's distances to 2 decimals, no
    reference's query id (a hash of its text) or row, no router path; the served budget's λ and state, which are its
    own controller's (tests/test_serve_policy.py); the app's own key sees them whole."""
    import copy

    from proxray.serve.request.report import completed

    report = {"routed": True, "lam": 0.7312, "lam_from": "budget", "outlier_score": 0.123456, "budget": {"x": 1},
              "router_path": "/r", "evidence": {"outlier_score": 0.123456, "elements": [
                  {"row": 7, "query_id": "q-3f2a", "task": "gsm8k", "distance": 0.123456, "weight": 0.5}]}}
    whole = copy.deepcopy(report)
    completed(whole, 0.1, {}, "r1", None, None, keyed=False)
    assert whole["outlier_score"] == 0.123456 and whole["evidence"]["elements"][0]["query_id"] == "q-3f2a"
    completed(report, 0.1, {}, "r1", None, {"name": "k"}, keyed=True)
    assert report["outlier_score"] == 0.12 and "router_path" not in report
    assert report["lam"] == 0.7312 and report["budget"] == {"x": 1}
    (element,) = report["evidence"]["elements"]
    assert element == {"task": "gsm8k", "distance": 0.12, "weight": 0.5} and report["evidence"]["outlier_score"] == 0.12
