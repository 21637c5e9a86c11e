"""kNN with a plug-in temperature, scored by refitting saved kNN runs — an ablation, not shipped (not a timed test).

    python research/tau/knn_plugin.py --from-json out/knn_study.json,out/knn_out-of-sample.json

KMeans' auto is the plug-in temperature (research/tau-study.md: the plug-in temperature): per query the 1/tau minimizing the
paper's squared-error bound Σ_i w_i² var_i + c · L² · (Σ_i w_i φ_i)², read off the fitted clusters. This tries the
same for kNN, whose reference elements are single training queries: a training query's outcome is one Bernoulli draw,
so var_i is the query's neighbourhood variance σ²(x) = mean_m p̄_m (1 − p̄_m) (p̄ the mean accuracy of its k
neighbours, the same for all k), and L² is fitted by least squares through the origin over training pairs (a seeded
sample of up to 1,000 training queries and their k neighbours: mean_m (A_im − A_jm)² − 2 σ²_i ≈ L² d_ij²). Each saved
configuration and seed's test router is refitted (the same seed; it raises unless Base's test scores reproduce the
saved ones to 1e-6) and scored at every c of ``WEIGHTS`` beside kNN's auto (spread 0.2, read from the run) and fixed
1/tau. Printed: Prox − Base (mean over configurations of the seeds' mean), losers (> 0.3 pp outlier / > 0.5 pp
inlier) and the median 1/tau the plug-in picks.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from km_plugin import saved_rows, table_loader  # noqa: E402
from tau_selection import LOSS, SETTINGS, SPLITS, fit_test_run, test_splits  # noqa: E402

from cv import GRID  # noqa: E402

WEIGHTS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
BASE = GRID.index(0.0)  # kNN's Base: uniform over the k neighbours
AUTO = SETTINGS.index("spr:0.2")
FIXED = (2.0, 5.0, 10.0, 20.0)


def neighbour_stats(router, seed: int, sample: int = 1000) -> float:
    """L² of the plug-in for a fitted KNNRouter: least squares through the origin of mean_m (A_im − A_jm)² − 2 σ²_i
    on d_ij² over a seeded sample of training queries i and their k nearest others j (σ²_i: i's neighbourhood
    variance); 0 where no pair says otherwise."""
    A = router.acc_values_
    S = np.random.default_rng(seed).choice(len(A), size=min(sample, len(A)), replace=False)
    dist, idx = router.index_.search(router.reference_[S], router.k_ + 1)
    keep = (idx != S[:, None]) & (idx >= 0)
    ys, d2 = [], []
    for i, row_idx, row_d, k in zip(S, idx, dist, keep):
        near = A[row_idx[k]]
        ys.append(np.square(A[i][None] - near).mean(axis=1) - 2 * _variance(near[None])[0])
        d2.append(np.square(row_d[k]))
    y, d2 = np.concatenate(ys), np.concatenate(d2)
    denom = float(np.square(d2).sum())
    return max(float((y * d2).sum()) / denom, 0.0) if denom > 0 else 0.0


def _variance(near) -> np.ndarray:
    """σ² per row of neighbours' accuracies (q, k, M): mean_m p̄_m (1 − p̄_m)."""
    p = near.mean(axis=1)
    return (p * (1 - p)).mean(axis=1)


def plugin_weights(phi, ref, values, l2: float, weights=WEIGHTS) -> list:
    """Per c of ``weights``: (per-query 1/tau of weights.BV_GRID, the weights at it) minimizing σ²(x) Σ w² +
    c · L² · (Σ w φ)² — ``weights.bias_variance_weights`` with a uniform prior and every neighbour's variance σ²(x),
    from the neighbours' mean accuracies (``values`` (n, M) gathered by ``ref``)."""
    from proxray.routing.weights import bias_variance_weights

    s2 = _variance(values[np.maximum(ref, 0)])
    return bias_variance_weights(phi, None, np.broadcast_to(s2[:, None], np.shape(phi)), l2, weights)


def config_result(row, seeds, cache) -> dict:
    """Per split, Prox − Base (mean over seeds) of auto, the plug-in at each c and FIXED; the median 1/tau picked."""
    from proxray.experiments.metrics import routing_score
    from proxray.routing.weights import proximity_weights

    table, X, acc, cost = cache(row["table"])
    per = {k: [] for k in SPLITS}
    picked = []
    for seed, s in zip(seeds, row["seeds"]):
        sp, _, r = fit_test_run(table, X, acc, cost, "knn", row["protocol"], row["outliers"], seed)
        l2 = neighbour_stats(r, seed)
        for k, idx in test_splits(sp).items():
            phi, ref, _ = r.neighbourhood(X[idx])
            c = None if cost is None else cost[idx]
            base = routing_score(*r.estimate_at(proximity_weights(phi, 0.0), ref), acc[idx], c)
            if abs(base - s["test"][k][BASE]) > 1e-6:
                raise RuntimeError(f"{row['table']} {row['outliers']} seed {seed}: the refit's Base does not "
                                   "reproduce the saved run (another machine or version?)")
            pw = plugin_weights(phi, ref, r.acc_values_, l2)
            got = [s["test"][k][AUTO] - base, *(routing_score(*r.estimate_at(w, ref), acc[idx], c) - base
                                               for _, w in pw),
                   *(s["test"][k][GRID.index(g)] - base for g in FIXED)]
            per[k].append(got)
            if k == "overall":
                picked.append([float(np.median(t)) for t, _ in pw])
    return {"table": row["table"], "protocol": row["protocol"], "outliers": row["outliers"],
            "delta": {k: np.mean(v, axis=0) for k, v in per.items()}, "median_inv_tau": np.median(picked, axis=0)}


def report(results: list) -> str:
    names = ["spread 0.2 (kNN's auto)", *(f"plug-in, c = {c:g}" for c in WEIGHTS),
             *(f"fixed 1/tau = {g:g}" for g in FIXED)]
    lines = ["| rule | Δ outlier | Δ inlier | Δ overall | losers (out/in) | median 1/tau picked |",
             "|---|---|---|---|---|---|"]
    for j, name in enumerate(names):
        d = {k: np.array([r["delta"][k][j] for r in results]) for k in SPLITS}
        med = (f"{np.median([r['median_inv_tau'][j - 1] for r in results]):g}" if 1 <= j <= len(WEIGHTS) else "")
        lines.append(f"| {name} | {d['outlier'].mean():+.2f} | {d['inlier'].mean():+.2f} | {d['overall'].mean():+.3f} "
                     f"| {(d['outlier'] < -LOSS['outlier']).sum()}/{(d['inlier'] < -LOSS['inlier']).sum()} | {med} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from-json", required=True, help="saved kNN runs of tau_selection.py --json, comma-separated")
    a = p.parse_args(argv)
    cache = table_loader()
    results = [config_result(row, seeds, cache) for row, seeds in saved_rows(a.from_json, "knn", "knn plug-in")]
    print(report(results))


if __name__ == "__main__":
    main()
