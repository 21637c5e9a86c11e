"""The routing plan: which models, in which order, for one request. Transport-free (no HTTP, no Ray):
the ingress gives it the request's options and the router's estimates, it gives back the candidates.
The choice itself is ``objective.choose`` — the same decision rule as evaluation."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from proxray.routing.objective import choose
from proxray.serve.errors import RequestError


@dataclass
class Plan:
    candidates: list  # model ids, best first; fallbacks follow in order
    report: dict = field(default_factory=dict)  # what the response's "proxray" object shows
    on_budget: bool = False  # λ came from the served budget, so the answer counts toward it
    budget: object = None  # then the controller it came from (the request's key's), which counts the answer
    vector: object = None  # the routing embedding of a routed request (what the response cache compares)

    def cost_of(self, model: str) -> float | None:
        """The router's estimated cost of ``model``'s answer (None where the plan holds no estimate of it: a named
        model's plan)."""
        return self.report.get("estimates", {}).get(model, {}).get("cost")


def not_served(model: str, served) -> RequestError:
    return RequestError(404, f"model {model!r} is not served; use 'proxray' for routing or one of: "
                        f"{', '.join(sorted(served))}", "model", "not_found_error")


def pass_through(model: str, served) -> Plan:
    """A request that names a served model goes there and nowhere else (no fallback, no encoder)."""
    if model not in served:
        raise not_served(model, served)
    return Plan([model], {"routed": False})


def candidate_order(acc_hat, cost_hat, lam: float, allowed) -> list:
    """Indices of the allowed models in ``routers.choose`` order: its choice, then its choice among the
    rest, and so on (the fallback order keeps the same rule, ties to the cheaper model)."""
    allowed = np.asarray(allowed, dtype=bool).copy()
    order = []
    while allowed.any():
        i = int(choose(acc_hat[None, :], cost_hat[None, :], lam, allowed[None, :])[0])
        order.append(i)
        allowed[i] = False
    return order


def none_honours(excluded: dict) -> RequestError:
    """The 400 of a routed request every allowed model of which refuses a parameter (``{model: [parameters]}``)."""
    names = sorted({p for r in excluded.values() for p in r})
    return RequestError(400, f"no routable model honours: {', '.join(names)} (refused by "
                        f"{', '.join(sorted(excluded))})", names[0])


def routed(models, served, acc_hat, cost_hat, outlier: float, lam: float, opts, router_path: str,
           refusals: dict | None = None) -> Plan:
    """The plan for ``model: proxray`` from one query's estimates (``acc_hat``, ``cost_hat``: (M,)).
    ``refusals``: ``{model: [parameters of this request it cannot honour]}`` — such models are left out."""
    allowed = np.array([m in served for m in models])
    routable = [m for m, a in zip(models, allowed) if a]
    if opts.allowed_models is not None:
        unknown = sorted(set(opts.allowed_models) - set(routable))
        if unknown:
            raise RequestError(400, f"proxray.allowed_models: {unknown} are not routable models "
                               f"({', '.join(routable)})", "proxray.allowed_models")
        allowed &= np.array([m in opts.allowed_models for m in models])
    excluded = {m: r for m, r in (refusals or {}).items() if r and m in models and allowed[models.index(m)]}
    if excluded:
        capable = allowed & np.array([m not in excluded for m in models])
        if not capable.any():
            raise none_honours(excluded)
        allowed = capable
    if opts.max_cost is not None:
        fits = cost_hat <= opts.max_cost
        if not (allowed & fits).any():
            raise RequestError(400, f"proxray.max_cost={opts.max_cost}: no allowed model is estimated that cheap "
                               f"(cheapest: {float(cost_hat[allowed].min()):.3g} USD)", "proxray.max_cost")
        allowed &= fits
    order = candidate_order(acc_hat, cost_hat, lam, allowed)
    report = {"routed": True, "lam": lam, "outlier_score": outlier, "router_path": router_path,
              "estimates": {models[i]: {"accuracy": float(acc_hat[i]), "cost": float(cost_hat[i])} for i in order},
              "runner_up": models[order[1]] if len(order) > 1 else None}
    if excluded:
        report["excluded"] = excluded  # left out: they cannot honour these parameters of the request
    return Plan([models[i] for i in order], report)
