"""The one objective and the one decision rule of routing (paper eq. 1):

    U_m(x) = acc_m(x) − λ · cost_m(x)        route(x) = argmax_m U_m(x)

``objective`` is the formula, ``choose`` the argmax with its tie rule, ``lambda_for_target`` the λ at which a
budget is met. Routers, metrics, the serving policy and the monitor all read it from here.
"""
from __future__ import annotations

import numpy as np


def objective(acc, cost, lam=0.0) -> np.ndarray:
    """acc − λ·cost, elementwise; ``lam`` a float, or one value per row of 2-d ``acc`` (q,). ``cost=None``: acc."""
    acc = np.asarray(acc, dtype=np.float64)
    if cost is None:
        return acc
    lam = np.asarray(lam, dtype=np.float64)
    if lam.ndim == 1 and acc.ndim == 2:
        lam = lam[:, None]
    return acc - lam * np.asarray(cost, dtype=np.float64)


def choose(acc_hat, cost_hat, lam=0.0, allowed=None) -> np.ndarray:
    """argmax_m acc_hat - lam * cost_hat per row; ties go to the cheaper model, then the lower index.

    acc_hat, cost_hat: (q, M). lam: float or (q,). allowed: None, (M,) or (q, M) boolean mask of
    models that may be chosen. Returns (q,) int64 model indices.
    """
    acc_hat = np.asarray(acc_hat, dtype=np.float64)
    cost_hat = np.asarray(cost_hat, dtype=np.float64)
    lam = np.asarray(lam, dtype=np.float64)
    if lam.ndim == 1:
        if len(lam) != len(acc_hat):
            raise ValueError(f"lam has {len(lam)} values for {len(acc_hat)} queries")
        lam = lam[:, None]
    elif lam.ndim != 0:
        raise ValueError(f"lam must be a float or shape (q,), got shape {lam.shape}")
    if (lam < 0).any() or np.isnan(lam).any():
        raise ValueError("lam must be >= 0")
    u = objective(acc_hat, cost_hat, lam)
    if allowed is not None:
        allowed = np.broadcast_to(np.asarray(allowed, dtype=bool), u.shape)
        if not allowed.any(axis=1).all():
            raise ValueError("allowed excludes every model for some query")
        u = np.where(allowed, u, -np.inf)
    best = u.max(axis=1, keepdims=True)
    tied = u >= best - 1e-12 * np.maximum(1.0, np.abs(best))
    return np.argmin(np.where(tied, cost_hat, np.inf), axis=1).astype(np.int64)


def lambda_for_target(acc_hat, cost_hat, models, target_cost: float | None = None,
                      target_share: dict | None = None, allowed=None) -> float:
    """The smallest λ >= 0 at which ``choose`` over estimates (q, M) meets a budget on these queries:
    ``target_cost`` — mean estimated cost per query at most this (USD); ``target_share`` — ``{model: s}``,
    each named model chosen for at most a fraction s of the queries (RouteLLM's strong-model percentage,
    for N models and any prices). Both may be given. Mean cost falls monotonically as λ grows, so it is
    bisected; a share need not be monotone for a mid-priced model, so a log grid finds the first λ that
    meets every share and bisection refines it. A target no λ can meet raises ValueError naming it."""
    acc_hat = np.asarray(acc_hat, dtype=np.float64)
    cost_hat = np.asarray(cost_hat, dtype=np.float64)
    models = list(models)
    if target_cost is None and not target_share:
        raise ValueError("give target_cost, target_share, or both")
    if target_cost is not None and not (np.isfinite(target_cost) and target_cost >= 0):
        raise ValueError(f"target_cost={target_cost!r}: must be a finite number >= 0")
    share = {}
    for m, v in (target_share or {}).items():
        if m not in models:
            raise ValueError(f"target_share names {m!r}, not one of the router's models ({', '.join(models)})")
        if not 0 <= v <= 1:
            raise ValueError(f"target_share[{m!r}]={v!r}: must be in [0, 1]")
        share[models.index(m)] = float(v)
    rows = np.arange(len(acc_hat))

    def meets(lam) -> bool:
        pick = choose(acc_hat, cost_hat, lam, allowed)
        ok_cost = target_cost is None or cost_hat[rows, pick].mean() <= target_cost * (1 + 1e-9)
        return ok_cost and all(np.mean(pick == j) <= v + 1e-12 for j, v in share.items())

    if meets(0.0):
        return 0.0
    spread = np.ptp(cost_hat, axis=1)
    gap = spread[spread > 0].min() if (spread > 0).any() else 1.0
    hi = 2.0 / gap  # past it every query takes a cheapest model: accuracies differ by at most 1
    if not meets(hi):
        cheapest = choose(acc_hat, cost_hat, hi, allowed)
        raise ValueError(f"no λ meets the target (target_cost={target_cost}, target_share={target_share}): even "
                         f"the cheapest routing spends {cost_hat[rows, cheapest].mean():.6g} per query with shares "
                         + ", ".join(f"{models[j]} {np.mean(cheapest == j):.3f}" for j in share))
    grid = np.geomspace(hi * 1e-9, hi, 200)
    first = next(i for i, lam in enumerate(grid) if meets(lam))
    lo, hi = (0.0 if first == 0 else grid[first - 1]), grid[first]
    for _ in range(60):  # lo fails, hi meets
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    return float(hi)
