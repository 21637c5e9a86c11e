"""Choosing 1/tau from training data alone (``--inv-tau auto``).

The paper tunes tau by hand on held-out data. Here it is chosen by leave-one-training-task-out
cross-validation, which mimics the deployment question "how well do we route a task we have not
seen?" without ever looking at the test split or the outlier tasks:

for each training task t (in turn playing the outlier):
    fit Prox on 80 % of the other training tasks (plus ``few_shot`` queries of t in the few-shot
    protocol), score routing on the rest of t (outlier score) and on the held-out 20 % of the other
    tasks (inlier score), for every 1/tau of the grid;
pick the 1/tau with the best mean of (outlier score + inlier score) / 2 over the folds.

The folds are repeated over ``CV_REPEATS`` random 80/20 splits (and task orders) and averaged: one pass's
curve is too noisy near its top to rank the best few 1/tau (README: How τ is chosen).

The grid contains the Base limit itself (inf for KMeans, 0 for kNN), so when tilting does not help
on the training tasks, auto falls back to the Base router. Fitting is done once per fold: the
weights are computed at estimate time, so every 1/tau reuses the same fitted reference set.
"""
from __future__ import annotations

import numpy as np

from .metrics import routing_score
from .routers import KMeansRouter, KNNRouter

CV_REPEATS = 3  # auto's CV averages its folds over 3 random splits (README: How τ is chosen)
GRID = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, float("inf"))


def make_router(kind: str, weighting: str, hp: dict, inv_tau: float = 20.0, n_train: int | None = None,
                temperature: str = "fixed"):
    """A KMeans ('km') or kNN ('knn') router from shared hyperparameters
    {n_clusters, k, random_state}; K is capped at the training-set size when given."""
    if kind == "km":
        K = hp.get("n_clusters", 32) if n_train is None else min(hp.get("n_clusters", 32), n_train)
        return KMeansRouter(n_clusters=K, weighting=weighting, inv_tau=inv_tau, random_state=hp.get("random_state", 42),
                            temperature=temperature)
    if kind == "knn":
        return KNNRouter(k=hp.get("k", 100), weighting=weighting, inv_tau=inv_tau, temperature=temperature)
    raise ValueError(f"router={kind!r}: allowed values are km, knn")


def brier_score(acc_hat, acc) -> float:
    """Minus the mean squared error (in %², higher is better) of the accuracy estimates against the observed
    correctness: a smooth, per-query criterion, unlike the hull-based AUC."""
    return -100.0 * float(np.mean((np.asarray(acc_hat, float) - np.asarray(acc, float)) ** 2))


def cv_curves(X, acc, cost, tasks, router: str, hp: dict, protocol: str = "leave-task-out", few_shot: int = 25,
              seed: int = 42, grid=GRID, min_task_size: int = 10, score: str = "routing",
              fold_tasks: int = 1, repeats: int = 1):
    """Leave-training-tasks-out scores for every 1/tau of ``grid``: (outlier (G,), inlier (G,)),
    each the mean over folds, or None when fewer than two tasks are large enough to hold out.
    ``score``: "routing" (normalized AUC, ``routing_score``) or "brier" (``brier_score`` of the estimates).
    ``fold_tasks``: how many training tasks a fold holds out together (1: each task once, in name order;
    more: the tasks in random groups of about that size, at least two groups), and in the few-shot protocol
    the ``few_shot`` shots are drawn from the group's queries together, as ``protocol_split`` draws them from
    all outlier tasks; ``repeats``: that many random partitions (and 80/20 splits), their folds averaged."""
    if score not in ("routing", "brier"):
        raise ValueError(f"score={score!r}: allowed values are routing, brier")
    for name, v in (("fold_tasks", fold_tasks), ("repeats", repeats)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}={v!r}: allowed values are integers >= 1")
    tasks = np.asarray(tasks)
    names, counts = np.unique(tasks, return_counts=True)
    eligible = [t for t, c in zip(names, counts) if c >= min_task_size]
    if len(eligible) < 2:
        return None
    rng = np.random.default_rng([seed, 17])
    if fold_tasks == 1 and repeats == 1:
        folds = [[t] for t in eligible]  # the original leave-one-task-out order (and random stream)
    else:
        folds = [list(g) for _ in range(repeats)
                 for g in np.array_split(rng.permutation(eligible), max(2, len(eligible) // fold_tasks))]
    out_scores, in_scores = np.zeros(len(grid)), np.zeros(len(grid))
    for group in folds:
        in_group = np.isin(tasks, group)
        held = np.flatnonzero(in_group)
        rest = rng.permutation(np.flatnonzero(~in_group))
        cut = int(0.8 * len(rest))
        train, in_val, out_val = rest[:cut], rest[cut:], held
        if protocol == "few-shot-outlier" and few_shot > 0:
            held = rng.permutation(held)
            shots = held[: min(few_shot, len(held) // 2)]
            train, out_val = np.concatenate([train, shots]), held[len(shots):]
        fitted = make_router(router, "prox", hp, n_train=len(train)).fit(
            X[train], acc[train], None if cost is None else cost[train])
        for val, total in ((out_val, out_scores), (in_val, in_scores)):
            for g, (a_hat, c_hat) in enumerate(estimates_over(fitted, X[val], grid)):
                total[g] += (brier_score(a_hat, acc[val]) if score == "brier" else
                             routing_score(a_hat, c_hat, acc[val], None if cost is None else cost[val]))
    return out_scores / len(folds), in_scores / len(folds)


RELATIVE_FLOOR = 0.05  # distances below it count as it: an exact duplicate must not make 1/tau infinite


def estimates_over(fitted, X, settings):
    """The fitted Prox router's estimates for ``X`` at every temperature setting, from one search: a
    number is a fixed 1/tau; ``"rel:a"`` is a per-query 1/tau = a / max(phi_min(x), RELATIVE_FLOOR) — the
    nearer the query's nearest reference element, the sharper the tilt, and far queries are smoothed more
    (the paper's bias–variance argument); ``"spr:a"`` is 1/tau = a / std(phi(x)), the distances measured
    in units of their own spread over the query's reference set; ``"mix:a,b,..."`` averages the weights at
    the fixed 1/tau values a, b, ... (an ensemble over temperatures instead of one choice).
    Yields (acc_hat, cost_hat) per setting."""
    from .weights import proximity_weights, spread_scaled

    phi, ref, prior = fitted._search(X)
    nearest = np.maximum(np.where(np.isfinite(phi), phi, np.inf).min(axis=1), RELATIVE_FLOOR)
    scaled = None
    for setting in settings:
        if isinstance(setting, str) and setting.startswith("rel:"):
            w = proximity_weights(phi / nearest[:, None], float(setting[4:]), prior)
        elif isinstance(setting, str) and setting.startswith("spr:"):  # the routers' temperature="spread"
            scaled = spread_scaled(phi) if scaled is None else scaled
            w = proximity_weights(scaled, float(setting[4:]), prior)
        elif isinstance(setting, str) and setting.startswith("mix:"):
            taus = [float(v) for v in setting[4:].split(",")]
            w = sum(proximity_weights(phi, t, prior) for t in taus) / len(taus)
        else:
            w = proximity_weights(phi, float(setting), prior)
        yield fitted._values_at(w, ref)


NEAR_BASE_TOL = 1.0  # pp: the "near-base" rule's tolerance (README: How τ is chosen)
RULES = ("mean", "guarded", "near-base")


def select_inv_tau(out_cv, in_cv, router: str, grid=GRID, rule: str = "mean", max_inlier_loss: float = 0.5,
                   tol: float = NEAR_BASE_TOL) -> float:
    """Pick 1/tau from CV curves. ``mean``: best (outlier + inlier) / 2. ``guarded``: best outlier
    score among the 1/tau whose inlier score is within ``max_inlier_loss`` pp of the Base limit's.
    ``near-base``: among the 1/tau whose mean is within ``tol`` pp of the best mean, the one nearest the
    Base limit (KMeans: the largest, toward inf; kNN: the smallest, toward 0) — parsimony: tilt only as far
    as the CV can tell apart. In ``mean`` and ``guarded``, ties go to the first (smaller) 1/tau."""
    grid = np.asarray(grid, dtype=float)
    if rule == "mean":
        return float(grid[int(np.argmax((out_cv + in_cv) / 2))])
    if rule == "guarded":
        base = int(np.flatnonzero(np.isinf(grid))[0]) if router == "km" else int(np.flatnonzero(grid == 0)[0])
        ok = in_cv >= in_cv[base] - max_inlier_loss
        return float(grid[int(np.argmax(np.where(ok, out_cv, -np.inf)))])
    if rule == "near-base":
        mean = (np.asarray(out_cv) + np.asarray(in_cv)) / 2
        ok = grid[mean >= mean.max() - tol]
        return float(ok.max() if router == "km" else ok.min())
    raise ValueError(f"rule={rule!r}: allowed values are {', '.join(RULES)}")


def auto_inv_tau(X, acc, cost, tasks, router: str, hp: dict, protocol: str = "leave-task-out", few_shot: int = 25,
                 seed: int = 42, grid=GRID, rule: str = "mean", repeats: int = CV_REPEATS):
    """Return (chosen 1/tau, {1/tau: (CV outlier score, CV inlier score)}) from the training set only;
    ``repeats``: the CV's folds over that many random 80/20 splits, averaged (``cv_curves``)."""
    curves = cv_curves(X, acc, cost, tasks, router, hp, protocol, few_shot, seed, grid, repeats=repeats)
    if curves is None:
        return 20.0, {}  # too few training tasks to cross-validate: the paper's default
    out_cv, in_cv = curves
    chosen = select_inv_tau(out_cv, in_cv, router, grid, rule)
    return chosen, {float(g): (float(o), float(i)) for g, o, i in zip(grid, out_cv, in_cv)}
