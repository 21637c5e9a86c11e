"""The endpoint's routing policy and fallback loop on their own: no Ray, no HTTP, a real router and a scripted
model client (what each model answers, fails with or takes too long for)."""
import asyncio
import time

import numpy as np
import pytest
from conftest import blobs

from proxray import KNNRouter
from proxray.pool.spec import PriceSpec
from proxray.routing.objective import choose, objective
from proxray.serve.errors import RequestError
from proxray.serve.protocols.base import RoutingOptions
from proxray.serve.protocols.chat import CHAT, has_content
from proxray.serve.request.budget import BudgetController
from proxray.serve.request.fallback import first_answer
from proxray.serve.request.plan import Plan
from proxray.serve.request.policy import RoutingPolicy

MODELS = ["small", "mid", "big"]


@pytest.fixture(scope="module")
def router():
    X, acc, cost, _ = blobs(np.random.default_rng(1), models=3)
    return KNNRouter(k=10).fit(X, acc, cost * 1e-5, models=MODELS), X


def test_decide_is_the_routers_choice_at_the_requests_or_the_apps_lambda(router):
    r, X = router
    policy = RoutingPolicy(r, "r0", {m: None for m in MODELS}, lam=2e4)
    for lam_opt, lam in ((None, 2e4), (0.0, 0.0), (1e6, 1e6)):
        p = policy.decide(X[:1], RoutingOptions(lam=lam_opt))
        acc, cost = r.estimate(X[:1])
        assert p.candidates[0] == MODELS[int(choose(acc, cost, lam)[0])]
        u = objective(acc[0], cost[0], lam)  # the fallback order: best objective first, ties to the cheaper
        assert [u[MODELS.index(m)] for m in p.candidates] == sorted(u, reverse=True) or len(set(u)) < len(u)
        assert sorted(p.candidates) == sorted(MODELS) and p.report["lam"] == lam
        assert not p.on_budget and policy.meter(p, p.candidates[0]) is None


def test_only_served_models_are_candidates_and_a_router_with_none_is_refused(router):
    r, X = router
    policy = RoutingPolicy(r, "r0", {"small": None, "big": None})
    assert policy.routable == ["small", "big"]
    assert set(policy.decide(X[:1], RoutingOptions()).candidates) == {"small", "big"}
    other = KNNRouter(k=3).fit(X[:20], np.ones((20, 1)), models=["elsewhere"])
    assert policy.use_router(other, "r1") is False and policy.router_path == "r0"
    assert policy.use_router(r, "r2") is True and policy.router_path == "r2"
    with pytest.raises(ValueError, match="none of the router's models"):
        RoutingPolicy(other, "r1", {"small": None})


def test_a_budget_sets_lambda_counts_estimates_or_realised_cost(router):
    r, X = router
    est = BudgetController(1e-5, basis="estimated")
    policy = RoutingPolicy(r, "r0", {m: None for m in MODELS}, lam=0.0, budget=est)
    lam0 = est.lam
    p = policy.decide(X[:1], RoutingOptions())
    assert p.on_budget and p.report["lam"] == lam0 and est.n == 1  # counted when routed
    assert p.report["budget"] == est.report() and policy.meter(p, p.candidates[0]) is None
    assert not policy.decide(X[:1], RoutingOptions(lam=0.0)).on_budget and est.n == 1  # the request's λ: not counted
    prices = {m: PriceSpec(input_per_mtok=p, output_per_mtok=2 * p) for m, p in zip(MODELS, (1.0, 5.0, 20.0))}
    real = BudgetController(1e-5, basis="realised", prices=prices)
    policy = RoutingPolicy(r, "r0", {m: None for m in MODELS}, budget=real)
    p = policy.decide(X[:1], RoutingOptions())
    assert real.n == 0
    policy.meter(p, "big")({"prompt_tokens": 100, "completion_tokens": 50})
    assert real.n == 1 and real.recent == pytest.approx((100 * 20.0 + 50 * 40.0) / 1e6)


def test_each_key_has_a_budget_controller_of_its_own(router):
    """A key's routed requests move its own λ and report its own controller; another key's, and requests without a
    key, are untouched by them (on realised cost too: the answer counts toward the controller its plan came from)."""
    from proxray.serve.request.policy import request_policy
    from proxray.serve.tenancy.keys import KeySpec

    r, X = router
    prices = {m: PriceSpec(input_per_mtok=p, output_per_mtok=2 * p) for m, p in zip(MODELS, (1.0, 5.0, 20.0))}
    for basis in ("estimated", "realised"):
        app = BudgetController(1e-9, basis=basis, prices=prices)  # a target far below every model: each λ rises
        policy = RoutingPolicy(r, "r0", {m: None for m in MODELS}, budget=app)
        a, b = (KeySpec(name=n, sha256="0" * 64) for n in ("a", "b"))
        lam0 = app.lam
        for x in X[:20]:
            p = policy.decide(x[None], request_policy(RoutingOptions(), a))
            assert p.report["budget"] == app.of("a").report() and p.budget is app.of("a")
            if basis == "realised":
                policy.meter(p, p.candidates[0])({"prompt_tokens": 100, "completion_tokens": 50})
        assert app.of("a").n == 20 and app.of("a").lam > lam0
        assert app.n == 0 and app.lam == lam0 and "b" not in app.keys  # the app's and key b's: untouched
        p = policy.decide(X[:1], request_policy(RoutingOptions(), b))
        assert p.report["lam"] == lam0 and p.report["budget"]["requests"] == (basis == "estimated")
        assert policy.decide(X[:1], RoutingOptions()).report["lam"] == lam0  # no key: the app's controller


class Each(list):
    """A model's plans, one per time it is asked."""


class ActorDiedError(Exception):
    """As Ray names the error of a call whose actor died (the fallback reads the name, not Ray's class)."""


class Scripted:
    """A model client whose models answer as told: a list of objects, an exception, or a delay first."""

    def __init__(self, script: dict):
        self.script, self.asked, self.cancelled, self.patient = script, [], [], []

    def stream(self, model, endpoint, body, patient=True):
        self.asked.append((model, body["model"]))
        self.patient.append(patient)
        plan, client = self.script[model], self
        if isinstance(plan, Each):  # one plan per call, the last kept
            plan = plan[min(len(plan) - 1, sum(m == model for m, _ in self.asked) - 1)]

        class Gen:
            def __init__(self):
                self.items = list(plan) if isinstance(plan, list) else plan

            def __aiter__(self):
                return self

            async def __anext__(self):
                if isinstance(self.items, tuple):  # ("sleep", s)
                    await asyncio.sleep(self.items[1])
                if isinstance(self.items, BaseException):
                    raise self.items
                if not self.items:
                    raise StopAsyncIteration
                return self.items.pop(0)

            def cancel(self):
                client.cancelled.append(model)

        return Gen()


def answer(model, text="hi"):
    return {"model": model, "choices": [{"message": {"content": text}}]}


def run(client, candidates, stream=False, timeout_s=5.0):
    failed = []
    p = Plan(list(candidates), {"routed": False})
    got = asyncio.run(first_answer(client, p, {"model": "proxray"}, CHAT.upstream, stream, time.monotonic() + timeout_s,
                                   timeout_s, lambda m, why: failed.append((m, why)), has_content))
    return got, p, failed


def test_fallback_goes_down_the_candidates_and_reports_what_failed():
    overloaded = {"error": {"message": "busy", "type": "overloaded", "code": 503}}
    client = Scripted({"a": [overloaded], "b": RuntimeError("replica died"), "c": [answer("c")]})
    (model, head, _), p, failed = run(client, ["a", "b", "c"])
    assert model == "c" and head == [answer("c")] and [m for m, _ in client.asked] == ["a", "b", "c"]
    assert [b for _, b in client.asked] == ["a", "b", "c"]  # each model gets the request with its own name
    assert p.report["fallback_from"] == ["a", "b"] and [m for m, _ in failed] == ["a", "b"]
    assert "RuntimeError: replica died" in failed[1][1] and client.cancelled == ["a", "b"]


def test_a_model_whose_replica_died_with_the_request_is_asked_again_before_the_next_model():
    """The replica that had the turn died (Ray says so): the model's other replicas take it — its conversation keeps
    its model — and a model whose second try fails too gives the turn to the next candidate, asked once more only."""
    client = Scripted({"a": Each([ActorDiedError("died"), [answer("a")]]), "b": [answer("b")]})
    (model, head, _), p, failed = run(client, ["a", "b"])
    assert model == "a" and [m for m, _ in client.asked] == ["a", "a"] and [m for m, _ in failed] == ["a"]
    assert client.patient == [False, False]  # not the last candidate: a retry with no replica to take it moves on
    client = Scripted({"a": ActorDiedError("died"), "b": [answer("b")]})
    (model, _, _), p, failed = run(client, ["a", "b"])
    assert model == "b" and [m for m, _ in client.asked] == ["a", "a", "b"] and p.report["fallback_from"] == ["a"]
    client = Scripted({"a": RuntimeError("overloaded"), "b": [answer("b")]})  # not a lost replica: not asked again
    (model, _, _), _, _ = run(client, ["a", "b"])
    assert model == "b" and [m for m, _ in client.asked] == ["a", "b"]


def test_a_models_4xx_goes_back_to_the_client_and_every_failure_is_a_503():
    bad = {"error": {"message": "max_tokens too large", "type": "invalid_request_error", "param": "max_tokens",
                     "code": 400}}
    with pytest.raises(RequestError) as e:
        run(Scripted({"a": [bad], "b": [answer("b")]}), ["a", "b"])
    assert (e.value.status, e.value.param) == (400, "max_tokens")
    with pytest.raises(RequestError) as e:
        run(Scripted({"a": RuntimeError("x"), "b": []}), ["a", "b"])
    assert e.value.status == 503 and "every candidate model failed" in e.value.message


def test_a_routed_request_passes_over_a_model_that_refuses_one_of_its_parameters():
    """A model whose capabilities were not known in time refuses a parameter (its error says ``unsupported``):
    a routed request asks the next model; when every one refuses, the 400 names the parameters and the models. A
    named model's refusal goes back to the client as it is."""
    refuses = {"error": {"message": "model 'a' cannot honour: logprobs", "type": "invalid_request_error",
                         "param": "logprobs", "code": 400, "unsupported": True}}

    def routed_run(script, candidates):
        p = Plan(list(candidates), {"routed": True, "estimates": {m: {"accuracy": 0.5, "cost": 0.1} for m in script}})
        got = asyncio.run(first_answer(Scripted(script), p, {"model": "proxray"}, CHAT.upstream, False,
                                       time.monotonic() + 5.0, 5.0, lambda m, why: None, has_content))
        return got, p

    (model, _, _), p = routed_run({"a": [refuses], "b": [answer("b")]}, ["a", "b"])
    assert model == "b" and p.report["excluded"] == {"a": ["logprobs"]} and p.report["fallback_from"] == []
    with pytest.raises(RequestError) as e:
        routed_run({"a": [refuses], "b": [refuses]}, ["a", "b"])
    assert (e.value.status, e.value.param) == (400, "logprobs") and "no routable model honours: logprobs (refused " \
        "by a, b)" in str(e.value)
    with pytest.raises(RequestError) as e:
        run(Scripted({"a": [refuses], "b": [answer("b")]}), ["a", "b"])  # not routed: the model's own 400
    assert (e.value.status, e.value.param) == (400, "logprobs") and "model 'a' cannot honour" in str(e.value)


def test_a_translated_models_refusal_is_named_in_the_requests_own_words():
    """A model that takes a Responses or Messages request as chat completions refuses chat's parameter: the refusal,
    the routed pass-over's ``excluded`` and the 400 when none honours it name the parameter as the request did."""
    from proxray.serve.protocols.messages.turn import models as messages_models
    from proxray.serve.protocols.responses.turn import models as responses_models
    from proxray.serve.protocols.responses.turn import has_content as responses_content
    from proxray.serve.wire import UpstreamHeaders

    def refuses(param):
        return {"error": {"message": f"model 'a' cannot honour: {param}", "type": "invalid_request_error",
                          "param": param, "code": 400, "unsupported": True}}

    cases = [(lambda c: responses_models(c, set(), {"model": "proxray", "input": "Hi", "top_logprobs": 2}),
              "logprobs", "top_logprobs"),
             (lambda c: messages_models(c, set(), {"model": "proxray", "max_tokens": 8, "stop_sequences": ["x"],
                                                   "messages": [{"role": "user", "content": "Hi"}]},
                                        UpstreamHeaders({})), "stop", "stop_sequences")]
    for via, chat_word, word in cases:
        p = Plan(["a", "b"], {"routed": True, "estimates": {m: {"accuracy": 0.5, "cost": 0.1} for m in "ab"}})
        with pytest.raises(RequestError) as e:
            asyncio.run(first_answer(via(Scripted({"a": [refuses(chat_word)], "b": [refuses(chat_word)]})), p,
                                     {"model": "proxray"}, "/v1/x", False, time.monotonic() + 5.0, 5.0,
                                     lambda m, why: None, responses_content))
        assert p.report["excluded"] == {"a": [word], "b": [word]}, p.report
        assert (e.value.status, e.value.param) == (400, word) and f"no routable model honours: {word}" in str(e.value)


def test_time_runs_out_as_a_504_and_a_stream_commits_at_its_first_content():
    with pytest.raises(RequestError) as e:
        run(Scripted({"a": ("sleep", 5.0)}), ["a"], timeout_s=0.2)
    assert e.value.status == 504 and "timeout_s=0.2" in e.value.message
    role = {"choices": [{"delta": {"role": "assistant"}}]}
    text = {"choices": [{"delta": {"content": "Hel"}}]}
    assert not has_content(role) and has_content(text) and has_content({"usage": {"total_tokens": 3}, "choices": []})
    (model, head, rest), _, _ = run(Scripted({"a": [role, text, {"choices": [{"delta": {"content": "lo"}}]}]}), ["a"],
                                    stream=True)
    assert model == "a" and head == [role, text]  # the rest stays in the stream


def test_a_request_naming_one_model_gets_that_models_own_error():
    """A named model that fails with an error object (its endpoint refused the gateway's key: 502) answers with it,
    not with the 503 of a routed request whose every candidate failed."""
    refused = {"error": {"message": "model 'x': its endpoint refused the gateway's key (HTTP 401); out of routing for "
                                    "60 s", "type": "upstream_error", "code": 502}}
    with pytest.raises(RequestError) as e:
        run(Scripted({"x": [refused]}), ["x"])
    assert e.value.status == 502 and e.value.message.startswith("model 'x': its endpoint refused")
    with pytest.raises(RequestError) as e:
        run(Scripted({"x": [refused], "y": RuntimeError("down")}), ["x", "y"])
    assert e.value.status == 503


def test_a_keys_lambda_stands_before_the_served_budget_and_the_requests_own_before_both(router):
    """λ precedence: the request's own, then its API key's, then the served budget's (only such requests are counted
    by the budget controller), then the app's."""
    from proxray.serve.tenancy.keys import KeySpec
    from proxray.serve.request.policy import request_policy

    r, X = router
    est = BudgetController(1e-5, basis="estimated")
    policy = RoutingPolicy(r, "r0", {m: None for m in MODELS}, lam=7.0, budget=est)
    spec = KeySpec(name="k", sha256="0" * 64, lam=123.0)
    for asked, want, source in ((None, 123.0, "key"), (5.0, 5.0, "request")):
        opts = RoutingOptions(lam=asked)
        rp = request_policy(opts, spec)
        p = policy.decide(X[:1], rp)
        assert p.report["lam"] == want and not p.on_budget and p.report["lam_from"] == source
        assert opts.lam == asked  # the request's options are read, never changed
    assert est.n == 0
    lam0 = est.lam
    p = policy.decide(X[:1], RoutingOptions())  # no key λ, no request λ: the served budget's
    assert p.on_budget and p.report["lam"] == lam0 and est.n == 1 and p.report["lam_from"] == "budget"
    over = policy.decide(X[:1], request_policy(RoutingOptions(), spec).over_budget())
    assert over.report["lam"] == 1e9 and over.report["lam_from"] == "over_budget" and est.n == 1


def test_a_requests_policy_is_decided_once_with_a_stated_precedence():
    from proxray.serve.tenancy.keys import KeySpec
    from proxray.serve.request.policy import request_policy

    spec = KeySpec(name="k", sha256="0" * 64, allowed_models=["small", "big"])
    headers = {"x-proxray-explain": "true", "x-proxray-conversation": "c" * 300}
    rp = request_policy(RoutingOptions(allowed_models=["big", "other"]), spec, headers)
    assert rp.allowed_models == ("big",) and rp.explain and rp.conversation == "c" * 256 and rp.lam_from == "app"
    assert request_policy(RoutingOptions(conversation="body"), spec, headers).conversation == "body"
    assert request_policy(RoutingOptions(allowed_models=["other"]), spec).allowed_models == ()  # none left: a 403
    assert request_policy(RoutingOptions(), spec).allowed_models == ("small", "big")
    assert request_policy(RoutingOptions()).allowed_models is None and not request_policy(RoutingOptions()).explain
