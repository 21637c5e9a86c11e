"""Other KMeans kernels at fixed settings, on the configurations of research/tau/tau_selection.py (not a timed test).

    python research/tau/km_kernels.py [--configs study,out-of-sample,fresh,fresh2,fresh3,fresh4,fresh5] [--json out/km_kernels.json]

KMeans' auto before ess-or-shifted (``shifted``) tied the best single fixed 1/tau over all sets but trailed the best fixed 1/tau of each set
(research/tau-study.md: How τ is chosen). This asks whether another kernel family, at one fixed setting, would do better — the
way the spread temperature did for kNN. Each is ``weights.proximity_weights`` on other distances or another prior:

* ``f:a``      the fixed grid (1/tau = a), for reference;
* ``spr:a``    the spread temperature (``temperature="spread"``): phi / std of the query's K distances;
* ``rad:a``    each cluster's distance in units of its own radius s_i (phi_i / s_i): "inside the cluster" is < 1;
* ``topM:a``   only the M nearest clusters take part (the others absent), 1/tau = a;
* ``size:a`` / ``uniform:a``  the prior p_i ∝ n_i or uniform instead of n_i / s_i;
* ``mix:x|y``  the weights of two settings averaged;
* ``ess:E``    the adaptive bandwidth: per query the 1/tau at which the weights' effective sample size is E clusters
  (``weights.ess_inv_tau``; as t-SNE calibrates its perplexity per point);
* ``lsprM:a``  the spread temperature over the M nearest clusters only; ``nrad:a`` every distance in units of the
  query's nearest cluster's radius; ``rel:a`` in units of the nearest distance (``tuning.estimates_over``'s rel);
* ``gate:a`` / ``gater:a``  Base inside the nearest cluster's radius (gate) or outside it (gater), 1/tau = a else;
* ``maxs:a|b`` / ``mins:a|b``  the spread temperature a, floored / capped at the fixed 1/tau b.

Printed per set of configurations and over all: Prox − Base (mean over configurations × seeds 42, 7, 99) and the
configurations losing more than 0.3 pp outlier / 0.5 pp inlier, beside the best fixed 1/tau of the set in hindsight.
Fits once per configuration and seed; every setting reuses the one search (~2.5 min for all six sets).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tau_selection import D, SEEDS, SETS, effect, test_splits  # noqa: E402

from proxray.embeddings.encoder import SentenceEncoder  # noqa: E402
from proxray.experiments.protocols import protocol_split  # noqa: E402
from proxray.experiments.metrics import routing_score  # noqa: E402
from proxray.data.table import RoutingTable  # noqa: E402
from cv import GRID, RELATIVE_FLOOR, make_router  # noqa: E402
from kernels import tilted_weights  # noqa: E402
from proxray.routing.weights import proximity_weights  # noqa: E402

KERNELS = ("spr:2", "spr:4", "rad:1", "rad:2", "rad:4", "top4:10", "top4:20", "top8:20", "size:20", "uniform:20",
           "mix:spr:2|f:20", "mix:spr:2|f:50", "mix:spr:4|f:50",
           # added in the stop after: per-query scales not tried before
           "ess:1.5", "ess:2", "ess:3", "ess:5", "lspr4:1", "lspr4:2", "lspr8:1", "lspr8:2", "nrad:1", "nrad:2",
           "nrad:4", "rel:2", "rel:5", "rel:10", "gate:20", "gater:20", "maxs:2|20", "mins:2|20", "maxs:4|50")
SETTINGS = tuple(f"f:{g:g}" for g in GRID) + KERNELS  # the grid first: effect() finds Base by its grid index


def radii(fitted) -> np.ndarray:
    """The clusters' radii s_i (K,), a zero one floored at the smallest positive one, as the prior floors it."""
    s = fitted.spreads_
    return np.maximum(s, s[s > 0].min() if (s > 0).any() else 1.0)


def kernel_weights(fitted, phi, prior, setting: str) -> np.ndarray:
    """The weights of one ``setting`` (module docstring) for the fitted KMeans router's distances ``phi``."""
    kind, _, a = setting.partition(":")
    if kind == "mix":
        parts = a.split("|")
        return sum(kernel_weights(fitted, phi, prior, p) for p in parts) / len(parts)
    if kind == "f":
        return proximity_weights(phi, float(a), prior)
    if kind == "spr":
        return tilted_weights(phi, float(a), prior, "spread")
    if kind == "rad":
        return proximity_weights(phi / radii(fitted)[None, :], float(a), prior)
    if kind.startswith("top"):
        m = int(kind[3:])
        cut = np.sort(phi, axis=1)[:, m - 1:m]
        return proximity_weights(np.where(phi <= cut, phi, np.inf), float(a), prior)
    if kind == "ess":
        return tilted_weights(phi, float(a), prior, "ess")
    if kind.startswith("lspr"):  # spread over the M nearest clusters only (kNN's spread is local too)
        m = int(kind[4:])
        near = np.sort(phi, axis=1)[:, :m]
        return proximity_weights(phi / np.maximum(near.std(axis=1), 1e-3)[:, None], float(a), prior)
    if kind == "nrad":  # every distance in units of the query's nearest cluster's radius
        return proximity_weights(phi / radii(fitted)[np.argmin(phi, axis=1)][:, None], float(a), prior)
    if kind == "rel":  # tuning.estimates_over's rel:a
        return proximity_weights(phi / np.maximum(phi.min(axis=1), RELATIVE_FLOOR)[:, None], float(a), prior)
    if kind in ("gate", "gater"):  # Base inside the nearest cluster's radius (gate) or outside it (gater)
        s = fitted.spreads_
        inside = phi.min(axis=1) <= s[np.argmin(phi, axis=1)]
        hard, soft = proximity_weights(phi, np.inf, prior), proximity_weights(phi, float(a), prior)
        use_hard = inside if kind == "gate" else ~inside
        return np.where(use_hard[:, None], hard, soft)
    if kind in ("maxs", "mins"):  # the spread temperature, floored (maxs) or capped (mins) at a fixed 1/tau
        x, y = (float(v) for v in a.split("|"))
        sd = np.maximum(phi.std(axis=1), 1e-3)
        it = (np.maximum if kind == "maxs" else np.minimum)(x / sd, y)
        return proximity_weights(phi * it[:, None], 1.0, prior)
    if kind in ("size", "uniform"):
        n = fitted.sizes_
        p = n.copy() if kind == "size" else (n > 0).astype(np.float64)
        return proximity_weights(phi, float(a), p / p.sum())
    raise ValueError(f"setting={setting!r}: unknown kernel")


def run_set(configs, enc, cache) -> list:
    rows = []
    for name, router, protocol, outliers in configs:
        if router != "km":
            continue
        if name not in cache:
            t = RoutingTable.read(D / f"{name}.parquet")
            cache[name] = (t, enc.encode(t.prompts), *t.matrices())
        table, X, acc, cost = cache[name]
        seeds = []
        for seed in SEEDS:
            sp = protocol_split(table.tasks, outliers, protocol, seed)
            tr, c = sp.base_train, (lambda idx: None if cost is None else cost[idx])
            fitted = make_router("km", "prox", {"n_clusters": 32, "random_state": seed}).fit(X[tr], acc[tr], c(tr))
            scores = {}
            for k, idx in test_splits(sp).items():
                phi, ref, prior = fitted.neighbourhood(X[idx])
                scores[k] = [routing_score(*fitted.estimate_at(kernel_weights(fitted, phi, prior, s), ref), acc[idx], c(idx))
                             for s in SETTINGS]
            seeds.append({"test": scores})
        rows.append({"table": name, "router": "km", "protocol": protocol, "outliers": outliers, "seeds": seeds})
        print(f"[km-kernels] {name} {protocol} {','.join(outliers)}", file=sys.stderr, flush=True)
    return rows


def effects(rows, si: int) -> dict:
    """``tau_selection.effect`` at setting ``si`` (the settings open with the grid, so its Base index is f:inf's)."""
    return effect(rows, lambda s: si)


def report(sets: dict) -> None:
    names = list(sets)
    print("| setting | " + " | ".join(f"{n} ({len(sets[n])})" for n in names) + " | all: overall / outlier (losers) |")
    print("|---|" + "---|" * (len(names) + 1))
    best = [max(effects(sets[n], g)["overall"].mean() for g in range(len(GRID))) for n in names]
    print("| best fixed 1/τ of the set (hindsight) | " + " | ".join(f"{b:+.2f}" for b in best) + " | |")
    for si, s in enumerate(SETTINGS):
        es = [effects(sets[n], si) for n in names]
        ov = np.concatenate([e["overall"] for e in es])
        out = np.concatenate([e["outlier"] for e in es])
        print(f"| {s.replace('|', ' + ')} | " + " | ".join(f"{e['overall'].mean():+.2f} ({e['lose_out']}/{e['lose_in']})" for e in es)
              + f" | {ov.mean():+.2f} / {out.mean():+.2f} ({sum(e['lose_out'] for e in es)}/{sum(e['lose_in'] for e in es)}) |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=",".join(SETS), help=f"comma-separated sets of configurations: {', '.join(SETS)}")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    unknown = [n for n in a.configs.split(",") if n not in SETS]
    if unknown:
        p.error(f"--configs: unknown set(s) {unknown}; allowed: {', '.join(SETS)}")
    enc, cache = SentenceEncoder(progress=False), {}
    sets = {n: run_set(SETS[n], enc, cache) for n in a.configs.split(",")}
    report(sets)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"settings": list(SETTINGS), "sets": sets}))


if __name__ == "__main__":
    main()
