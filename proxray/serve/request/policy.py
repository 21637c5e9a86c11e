"""The routing policy of the endpoint, with no HTTP and no Ray in it: which router answers, at which λ (the
request's, the served budget's, or the app's), the plan's candidates in fallback order, and how an answer counts
toward a budget on realised cost. The ingress gives it an embedding and the models' refusals; unit tests give
it the same."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from proxray.routing.explain import evidence
from proxray.serve.config import ConversationSpec
from proxray.serve.request import plan as planning
from proxray.serve.request.budget import BudgetController
from proxray.serve.request.turn_cost import turn_costs
from proxray.serve.tenancy.conversations import keep, weigh_cache
from proxray.serve.tenancy.rules import KeyRules, narrow

logger = logging.getLogger("ray.serve")
TRUE = ("1", "true", "yes")


@dataclass(frozen=True)
class RequestPolicy:
    """How one routed request is decided, fixed once (``request_policy``) from the app's defaults, its API key's policy,
    its own ``proxray`` options and its headers, then read — never changed — by planning, charging and reporting.

    Precedence, field by field: λ — the request's ``proxray.lam``, else its model alias's, else its key's λ, else
    (``lam`` None) the served budget's, else the app's (``lam_from`` says which: request, alias, key, over_budget,
    app); models — the request's ``proxray.allowed_models`` within its alias's, within its key's (an empty tuple: none
    left); ``max_cost`` — the request's; the
    conversation — the body's ``proxray.conversation``, else the ``x-proxray-conversation`` header; evidence — the
    body's ``proxray.explain`` or the ``x-proxray-explain`` header. Only requests whose λ is the served budget's are
    counted by the budget controller."""
    lam: float | None = None
    lam_from: str = "app"
    allowed_models: tuple | None = None
    max_cost: float | None = None
    conversation: str | None = None
    explain: bool = False
    key: str | None = None  # the name of its API key of the keys file: the served budget's controller is that key's

    def over_budget(self) -> "RequestPolicy":
        """The same request with cost deciding among the models it may use (its key over budget, ``cheapest``)."""
        return replace(self, lam=1e9, lam_from="over_budget")


def request_policy(opts, key=None, headers=None, alias=None) -> RequestPolicy:
    """The ``RequestPolicy`` of a request's ``proxray`` options ``opts``, its API key's ``KeySpec`` (or None), its
    HTTP ``headers`` (a mapping, lower-case names) and the model alias it named (``ModelAlias`` or None)."""

    headers = headers or {}
    allowed = KeyRules.narrowed(key, narrow(alias and alias.allowed_models, opts.allowed_models))
    if opts.lam is not None:
        lam, source = opts.lam, "request"
    elif alias is not None and alias.lam is not None:
        lam, source = alias.lam, "alias"
    elif KeyRules.lam(key) is not None:
        lam, source = KeyRules.lam(key), "key"
    else:
        lam, source = None, "app"
    conversation = opts.conversation if opts.conversation is not None else \
        (headers.get("x-proxray-conversation") or "")[:256] or None
    explain = bool(opts.explain) or str(headers.get("x-proxray-explain", "")).lower() in TRUE
    return RequestPolicy(lam, source, allowed, opts.max_cost, conversation, explain, key.name if key else None)


class RoutingPolicy:
    """``decide(X, rp, refusals)`` -> the ``Plan`` under a request's ``RequestPolicy``; ``use_router`` switches routers between requests;
    ``meter(plan, model)`` counts an answer toward a realised-cost budget."""

    def __init__(self, router, router_path: str, served, lam: float = 0.0, budget=None, conversations=None,
                 prices: dict | None = None):
        self.served = served  # model ids the app serves (a mapping or set)
        self.prices = prices or {}  # model id -> PriceSpec: a conversation's turn is priced at them
        self.lam, self.budget = lam, budget
        self.conversations = conversations or ConversationSpec()
        self.router = self.router_path = None
        self.routable: list = []
        if not self.use_router(router, router_path):
            raise ValueError(f"none of the router's models {router.models_} is served ({sorted(served)})")

    def use_router(self, router, path: str) -> bool:
        """Switch routers between requests: a request reads the router once and routes with that router's own
        model list, so none is answered through a mismatched list; a model the router knows but the app does not
        serve is never chosen. A router with no served model is refused (False) and the current one kept."""
        routable = [m for m in router.models_ if m in self.served]
        if not routable:
            if self.router is not None:
                logger.warning("proxray: router %s has no served model; keeping %s", path, self.router_path)
            return False
        self.router, self.router_path, self.routable = router, path, routable
        return True

    def reach(self, rp: RequestPolicy) -> list:
        """The routable models a routed request under ``rp`` may reach (its allowed models among them)."""
        return [m for m in self.routable if rp.allowed_models is None or m in rp.allowed_models]

    def lam_for(self, rp: RequestPolicy) -> tuple[float, bool]:
        """(λ, whether it is the budget's): the request policy's (the request's own or its key's), else the served
        budget's (its key's controller), else the app's."""
        if rp.lam is not None:
            return rp.lam, False
        if self.budget is not None:
            return self.budget.of(rp.key).lam, True
        return self.lam, False

    def decide(self, X, rp, refusals: dict | None = None, previous: str | None = None,
               visible=None, tool_loop: bool = False, session: dict | None = None, facts=None) -> planning.Plan:
        """The plan for one routed query's embedding ``X`` (1, d) under its ``RequestPolicy`` ``rp`` (or bare
        ``proxray`` options, read as a request without a key or headers); ``refusals``: ``{model: [parameters it
        cannot honour]}``; ``previous``: the model of the request's conversation, kept first unless another beats it
        by the conversations rule (always in a ``tool_loop``); ``visible``: the models the asker may see in the evidence
        (its API key's; default: all); ``session``: what the conversations book holds of the conversation and
        ``facts`` (``turn_cost.TurnFacts``) the turn's prompt: under the ``cache_aware`` rule each candidate's cost is
        then this turn's expected bill there (``turn_cost.turn_costs``), the table's estimate otherwise. A budget on
        estimated cost counts the chosen model's estimate now."""
        router, path = self.router, self.router_path
        rp = rp if isinstance(rp, RequestPolicy) else request_policy(rp)
        acc, cost, outlier = router.estimate_with_outlier_score(X)  # one search for both
        lam, on_budget = self.lam_for(rp)
        costs = None
        if rp.conversation is not None and session and facts is not None and self.conversations.rule == "cache_aware":
            costs = turn_costs(router.models_, self.prices, session, facts.prompt_tokens, facts.limit, facts.writes,
                               time.time(), self.conversations.switch_horizon_turns)
        c = np.asarray(costs.cost) if costs is not None else cost[0]
        p = planning.routed(router.models_, self.served, acc[0], c, float(outlier[0]), lam, rp, path, refusals)
        p.report["lam_from"] = "budget" if on_budget else rp.lam_from
        if rp.conversation is not None:
            if costs is not None:
                told = weigh_cache(p.candidates, previous, acc[0], costs, lam, router.models_, tool_loop)
            else:
                told = keep(p.candidates, previous, acc[0], cost[0], lam, router.models_, self.conversations, tool_loop)
            rule = ("margin" if self.conversations.rule == "margin" else "cache_aware" if costs is not None else
                    "table" if session else "first_turn")  # table: a candidate without a price
            p.report["conversation"] = {"id": rp.conversation, "rule": rule, **told}
            p.report["runner_up"] = p.candidates[1] if len(p.candidates) > 1 else None
        if rp.explain:  # asked for: one more pass over the same neighbourhood, bounded in size
            t0 = time.perf_counter()
            p.report["evidence"] = evidence(router, X, lam, p.candidates, visible=visible)
            p.report["evidence"]["explain_ms"] = round(1e3 * (time.perf_counter() - t0), 3)
        if on_budget:
            budget = self.budget.of(rp.key)
            if budget.basis == "estimated":  # known now; a realised cost when the answer is complete
                budget.observe(c[router.models_.index(p.candidates[0])])
            p.on_budget, p.budget, p.report["budget"] = True, budget, budget.report()
        return p

    def meter(self, p: planning.Plan, model: str, free: bool = False):
        """How ``model``'s answer to plan ``p`` counts toward a budget on realised cost: a function of the answer's
        usage, or None where nothing is counted at the end (no budget, λ given by the request, or a budget on
        estimated cost, counted when routed). An answer without usage counts at its estimate; a ``free`` one (the
        response cache's) at 0."""
        if not p.on_budget or p.budget.basis != "realised":
            return None
        if free:
            return lambda usage: p.budget.answered(model, None, 0.0)
        estimate = p.report["estimates"][model]["cost"]
        return lambda usage: p.budget.answered(model, usage, estimate)


def budget_from(args):
    """The served budget of the app args (``budget:``), or None."""
    if args.budget is None:
        return None

    b = args.budget
    return BudgetController(b.cost_per_query, b.lam0, b.window, b.gain, basis=b.basis,
                            prices={m.id: m.price for m in args.models if m.price is not None})
