"""Routing metrics: λ sweeps, normalized AUC (RouterBench's NDCH), RouteLLM's APGR / CPT, routing
match against post-hoc top-z models, and the paper's top-z Jaccard overlap between tasks.

Shapes: ``acc``, ``cost`` are observed (q, M) matrices of the evaluated queries; ``choices`` are
(q,) model indices, or (L, q) for L values of λ.
"""
from __future__ import annotations

import numpy as np

from proxray.routing.objective import choose, objective


def lambda_grid(cost, n: int = 61) -> np.ndarray:
    """λ values spanning "accuracy only" to "cheapest only" for costs on this scale: 0 and a
    geometric grid around 1 / (spread of the models' mean costs)."""
    if cost is None:
        return np.zeros(1)
    means = np.asarray(cost, dtype=np.float64).mean(0)
    spread = means.max() - means.min()
    scale = 1.0 / spread if spread > 0 else 1.0
    return np.concatenate([[0.0], np.geomspace(1e-3, 1e3, n - 1) * scale])


def operating_points(choices, acc, cost) -> np.ndarray:
    """(L, 2) array of (mean cost, mean accuracy) of the chosen models, one row per λ."""
    choices = np.atleast_2d(np.asarray(choices, dtype=np.int64))
    rows = np.arange(choices.shape[1])
    acc = np.asarray(acc, dtype=np.float64)
    cost = np.zeros_like(acc) if cost is None else np.asarray(cost, dtype=np.float64)
    return np.stack([[cost[rows, c].mean(), acc[rows, c].mean()] for c in choices])


def sweep(acc_hat, cost_hat, acc, cost, lams=None, allowed=None):
    """Route with estimates (q, M) at every λ and score against observations: (lams, choices (L, q),
    points (L, 2))."""
    lams = lambda_grid(cost) if lams is None else np.asarray(lams, dtype=np.float64)
    choices = np.stack([choose(acc_hat, cost_hat, lam, allowed) for lam in lams])
    return lams, choices, operating_points(choices, acc, cost)


def upper_hull(points) -> np.ndarray:
    """Non-decreasing upper convex hull of (cost, acc) points, sorted by cost: (h, 2).

    First the Pareto front (no point both cheaper-or-equal and more accurate), then the upper concave
    envelope of it (RouterBench's NDCH).
    """
    P = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    P = P[np.lexsort((-P[:, 1], P[:, 0]))]  # by cost, then best accuracy first
    front = []
    for c, a in P:
        if not front or a > front[-1][1]:
            front.append((c, a))
    hull = []
    for p in front:
        while len(hull) >= 2:
            (c1, a1), (c2, a2) = hull[-2], hull[-1]
            # drop the middle point if it lies on or below the chord from hull[-2] to p
            if (a2 - a1) * (p[0] - c1) <= (p[1] - a1) * (c2 - c1):
                hull.pop()
            else:
                break
        hull.append(p)
    return np.array(hull)


def ndch_auc(points, c_min: float, c_max: float) -> float:
    """Normalized area (percent) under the non-decreasing convex hull of the operating points over
    [c_min, c_max]: linear between hull points, flat right of the most accurate point, 0 left of the
    cheapest one; divided by (c_max - c_min)."""
    if not c_max > c_min:
        raise ValueError(f"cost range [{c_min}, {c_max}] is empty: AUC needs models of different cost")
    H = upper_hull(points)
    start = max(c_min, H[0, 0])
    if start >= c_max:
        return 0.0
    xs = np.unique(np.concatenate([[start, c_max], H[:, 0][(H[:, 0] > start) & (H[:, 0] < c_max)]]))
    ys = np.interp(xs, H[:, 0], H[:, 1])  # np.interp is flat beyond the last hull point
    area = float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2.0))
    return 100.0 * area / (c_max - c_min)


def cost_range(acc, cost):
    """(c_min, c_max): mean cost of the cheapest and of the most expensive single model."""
    means = np.asarray(cost, dtype=np.float64).mean(0)
    return float(means.min()), float(means.max())


def normalized_auc(points, acc, cost) -> float:
    """``ndch_auc`` over the cost range of the single models on the same queries."""
    return ndch_auc(points, *cost_range(acc, cost))


def baseline_points(acc, cost, largest: int) -> dict:
    """Operating points of router-free baselines on these queries: random (the expectation of
    uniform random routing), largest (the cheapest model's and model ``largest``'s points: random
    mixes of the two), oracle (post-hoc best, λ sweep), and each single model."""
    acc = np.asarray(acc, dtype=np.float64)
    cost = np.zeros_like(acc) if cost is None else np.asarray(cost, dtype=np.float64)
    singles = np.stack([cost.mean(0), acc.mean(0)], 1)
    oracle = operating_points(np.stack([choose(acc, cost, lam) for lam in lambda_grid(cost)]), acc, cost)
    # The largest model alone sits at c_max, where the NDCH curve starts, so its AUC is 0 by
    # definition; as a curve it is the random mix of the cheapest and the largest model (RouteLLM's
    # random weak/strong router), i.e. the segment between their two points.
    cheapest = int(np.argmin(singles[:, 0]))
    return {"random": singles.mean(0, keepdims=True), "largest": singles[[cheapest, largest]], "oracle": oracle,
            "singles": singles}


def pgr_curve(choices, acc, weak: int, strong: int):
    """Strong-call fraction and performance gap recovered of each λ row of ``choices`` (L, q) routed
    between a weak and a strong model: (frac (L,), pgr (L,))."""
    choices = np.atleast_2d(choices)
    acc = np.asarray(acc, dtype=np.float64)
    a_w, a_s = acc[:, weak].mean(), acc[:, strong].mean()
    if a_s == a_w:
        raise ValueError("weak and strong models have equal accuracy: PGR is undefined")
    rows = np.arange(choices.shape[1])
    frac = (choices == strong).mean(1)
    pgr = (acc[rows, choices].mean(1) - a_w) / (a_s - a_w)
    return frac, pgr


def apgr(frac, pgr) -> float:
    """RouteLLM's average performance gap recovered: area under PGR versus strong-call fraction over
    [0, 1], with (0, 0) and (1, 1) as end points and the best PGR taken at each fraction."""
    f = np.concatenate([[0.0], np.asarray(frac, float), [1.0]])
    p = np.concatenate([[0.0], np.asarray(pgr, float), [1.0]])
    order = np.lexsort((-p, f))
    f, p = f[order], p[order]
    keep = np.concatenate([[True], f[1:] != f[:-1]])
    f, p = f[keep], np.maximum.accumulate(p[keep])
    return float(np.sum((f[1:] - f[:-1]) * (p[1:] + p[:-1]) / 2.0))


def cpt(frac, pgr, target: float = 0.5) -> float:
    """RouteLLM's call-performance threshold: the smallest strong-call fraction reaching PGR >= target
    (1.0 if no operating point does)."""
    frac, pgr = np.asarray(frac, float), np.asarray(pgr, float)
    ok = pgr >= target
    return float(frac[ok].min()) if ok.any() else 1.0


def routing_match(choice, acc, cost, lam=0.0, z=(1, 3, 5)) -> dict:
    """Fraction of queries whose chosen model is among the post-hoc top-z models by observed
    acc - lam * cost. A model tied with the z-th best counts as in the top z."""
    u = objective(acc, cost, lam)
    chosen = u[np.arange(len(u)), np.asarray(choice)]
    ranked = -np.sort(-u, axis=1)
    M = u.shape[1]
    return {int(k): float((chosen >= ranked[:, min(k, M) - 1] - 1e-12).mean()) for k in z}


def top_z(values, z: int) -> frozenset:
    """The indices of the z largest ``values`` (M,); ties go to the lower index (a stable sort)."""
    return frozenset(np.argsort(-np.asarray(values, dtype=np.float64), kind="stable")[:z].tolist())


def topz_sets(acc, cost, tasks, lam=0.0, z: int = 5) -> dict:
    """S_z(t, λ): the z models with the highest mean observed objective on each task's queries (``top_z``)."""
    u = objective(acc, cost, lam)
    tasks = np.asarray(tasks)
    return {str(t): top_z(u[tasks == t].mean(0), z) for t in np.unique(tasks)}


def jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if (a or b) else 1.0


def topz_jaccard(acc, cost, tasks, outliers, lam=0.0, z: int = 5) -> float:
    """The paper's J_z^λ: mean top-z Jaccard overlap over all (outlier task, inlier task) pairs."""
    sets = topz_sets(acc, cost, tasks, lam, z)
    outs = [t for t in sets if t in set(outliers)]
    ins = [t for t in sets if t not in set(outliers)]
    if not outs or not ins:
        raise ValueError("topz_jaccard needs at least one outlier and one inlier task present")
    return float(np.mean([jaccard(sets[o], sets[i]) for o in outs for i in ins]))


def routing_score(acc_hat, cost_hat, acc, cost) -> float:
    """One number for routing with estimates (q, M) against observations: normalized AUC (%) over a
    λ sweep, or, for a table without cost, the mean accuracy (%) of the chosen models at λ = 0."""
    acc = np.asarray(acc, dtype=np.float64)
    if cost is None:
        chosen = choose(acc_hat, np.zeros_like(acc_hat), 0.0)
        return 100.0 * float(acc[np.arange(len(acc)), chosen].mean())
    _, _, pts = sweep(acc_hat, cost_hat, acc, cost)
    return ndch_auc(pts, *cost_range(acc, cost))
