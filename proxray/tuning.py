"""Choosing 1/tau from training data alone (``--inv-tau auto``).

The paper tunes tau by hand on held-out data. Here it is chosen by leave-one-training-task-out
cross-validation, which mimics the deployment question "how well do we route a task we have not
seen?" without ever looking at the test split or the outlier tasks:

for each training task t (in turn playing the outlier):
    fit Prox on 80 % of the other training tasks (plus ``few_shot`` queries of t in the few-shot
    protocol), score routing on the rest of t (outlier score) and on the held-out 20 % of the other
    tasks (inlier score), for every 1/tau of the grid;
pick the 1/tau with the best mean of (outlier score + inlier score) / 2 over the folds.

The grid contains the Base limit itself (inf for KMeans, 0 for kNN), so when tilting does not help
on the training tasks, auto falls back to the Base router. Fitting is done once per fold: the
weights are computed at estimate time, so every 1/tau reuses the same fitted reference set.
"""
from __future__ import annotations

import copy

import numpy as np

from .metrics import routing_score
from .routers import KMeansRouter, KNNRouter

GRID = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, float("inf"))


def make_router(kind: str, weighting: str, hp: dict, inv_tau: float = 20.0, n_train: int | None = None):
    """A KMeans ('km') or kNN ('knn') router from shared hyperparameters
    {n_clusters, k, random_state}; K is capped at the training-set size when given."""
    if kind == "km":
        K = hp.get("n_clusters", 32) if n_train is None else min(hp.get("n_clusters", 32), n_train)
        return KMeansRouter(n_clusters=K, weighting=weighting, inv_tau=inv_tau, random_state=hp.get("random_state", 42))
    if kind == "knn":
        return KNNRouter(k=hp.get("k", 100), weighting=weighting, inv_tau=inv_tau)
    raise ValueError(f"router={kind!r}: allowed values are km, knn")


def auto_inv_tau(X, acc, cost, tasks, router: str, hp: dict, protocol: str = "leave-task-out", few_shot: int = 25,
                 seed: int = 42, grid=GRID, min_task_size: int = 10):
    """Return (chosen 1/tau, {1/tau: mean CV score}) from the training set only (see module doc)."""
    tasks = np.asarray(tasks)
    names, counts = np.unique(tasks, return_counts=True)
    folds = [t for t, c in zip(names, counts) if c >= min_task_size]
    if len(folds) < 2:
        return 20.0, {}  # too few training tasks to cross-validate: the paper's default
    rng = np.random.default_rng([seed, 17])
    totals = np.zeros(len(grid))
    for t in folds:
        held = np.flatnonzero(tasks == t)
        rest = rng.permutation(np.flatnonzero(tasks != t))
        cut = int(0.8 * len(rest))
        train, in_val = rest[:cut], rest[cut:]
        out_val = held
        if protocol == "few-shot-outlier" and few_shot > 0:
            held = rng.permutation(held)
            shots = held[: min(few_shot, len(held) // 2)]
            train, out_val = np.concatenate([train, shots]), held[len(shots):]
        fitted = make_router(router, "prox", hp, n_train=len(train)).fit(
            X[train], acc[train], None if cost is None else cost[train])
        for g, inv_tau in enumerate(grid):
            r = copy.copy(fitted)
            r.inv_tau_ = float(inv_tau)
            s = []
            for val in (out_val, in_val):
                a_hat, c_hat = r.estimate(X[val])
                s.append(routing_score(a_hat, c_hat, acc[val], None if cost is None else cost[val]))
            totals[g] += np.mean(s)
    scores = totals / len(folds)
    best = int(np.argmax(scores))  # first best: ties go to the smaller 1/tau (more variance reduction)
    return float(grid[best]), {float(g): float(s) for g, s in zip(grid, scores)}
