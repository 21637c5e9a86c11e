"""KMeans' plug-in temperature with a *local* Lipschitz constant (an ablation, not shipped; not a timed test).

    python research/tau/km_local_lipschitz.py --from-json SAVED.json,... [--neighbours 1,3,5] [--weights 0.0625,...]
        [--json OUT.json]

The plug-in temperature (``temperature="bv"``, KMeans' auto) fits the accuracy's squared Lipschitz constant L² over
all pairs of clusters (``weights.bias_variance_stats``). Its weights fall on a query's nearest clusters, so the
constant that matters is the one between near clusters: ``neighbours=m`` fits L² only over the pairs where one cluster
is among the other's m nearest. On the routerdc7 configurations that lose outlier AUC to Base (their outliers want
the nearest cluster alone) the local constant is larger than the global one, on BBH mostly smaller — the direction
that could sharpen the one and smooth the other. This refits every saved configuration and seed's test router (as
research/tau/km_plugin.py does: the same seed, so the same clusters) and scores the plug-in at every bias weight c with L²
over all pairs and over each m. Printed per number of seeds (3 and 10 apart): Prox − Base (mean over configurations
of the seeds' mean), losers (> 0.3 pp outlier / > 0.5 pp inlier) and per table x protocol the difference from the
best fixed 1/tau in hindsight (read from the saved runs). Base is the refit's own; where it differs from the saved
run's by more than 1e-6 (another number of threads can move a KMeans sum) the count and the largest difference are
printed. ~0.9 s per configuration and seed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from km_plugin import BASE, saved_rows, table_loader  # noqa: E402
from tau_selection import LOSS, SPLITS, fit_test_run, fixed_deltas, test_splits  # noqa: E402

from proxray.common.storage import replace_atomically  # noqa: E402
from cv import GRID  # noqa: E402


def config_scores(row, seeds, cache, neighbours, weights) -> dict:
    """{variant: {split: [Prox − Base per seed]}} of one saved configuration, "all:c" the shipped fit (all pairs),
    "local m:c" the local one, and the Base check {"mismatches": n, "largest": d} against the saved run."""
    from proxray.routing.index import pairwise_distance
    from proxray.experiments.metrics import routing_score
    from proxray.routing.weights import bias_variance_stats, bias_variance_weights, proximity_weights

    table, X, acc, cost = cache(row["table"])
    out, check = {}, {"mismatches": 0, "largest": 0.0}
    for seed, saved in zip(seeds, row["seeds"]):
        sp, _, r = fit_test_run(table, X, acc, cost, "km", row["protocol"], row["outliers"], seed)
        D = pairwise_distance(r.centers_, r.centers_, r.metric)
        fits = {"all": bias_variance_stats(r.acc_values_, r.sizes_, D),
                **{f"local {m}": bias_variance_stats(r.acc_values_, r.sizes_, D, neighbours=m) for m in neighbours}}
        for split, idx in test_splits(sp).items():
            phi, _, prior = r.neighbourhood(X[idx])
            c = None if cost is None else cost[idx]
            wb = proximity_weights(phi, float("inf"), prior)
            base = routing_score(wb @ r.acc_values_, wb @ r.cost_values_, acc[idx], c)
            gap = abs(base - saved["test"][split][BASE])
            check["mismatches"] += gap > 1e-6
            check["largest"] = max(check["largest"], gap)
            for name, (var, l2) in fits.items():
                for cw, (_, w) in zip(weights, bias_variance_weights(phi, prior, var, l2, weights)):
                    score = routing_score(w @ r.acc_values_, w @ r.cost_values_, acc[idx], c)
                    out.setdefault(f"{name}:{cw:g}", {}).setdefault(split, []).append(score - base)
    fixed = {k: fixed_deltas(row, k).mean(axis=0) for k in SPLITS}
    return {"table": row["table"], "protocol": row["protocol"], "outliers": row["outliers"],
            "n_seeds": len(row["seeds"]), "scores": out, "fixed": {k: v.tolist() for k, v in fixed.items()},
            "base_check": check}


def report(results: list) -> str:
    """Markdown, one table per number of seeds: each variant's Prox − Base, losers, and per table x protocol its
    difference from the best fixed 1/tau in hindsight."""
    parts = []
    for n in sorted({r["n_seeds"] for r in results}):
        rs = [r for r in results if r["n_seeds"] == n]
        groups = sorted({(r["table"], r["protocol"]) for r in rs})
        member = {g: [i for i, r in enumerate(rs) if (r["table"], r["protocol"]) == g] for g in groups}
        best = {g: np.mean([rs[i]["fixed"]["overall"] for i in member[g]], axis=0) for g in groups}
        lines = [f"{len(rs)} configurations, {n} seeds each; columns after losers: Prox − Base overall − the best "
                 "fixed 1/tau in hindsight of the group", "",
                 "| L², c | Δ overall | Δ outlier | Δ inlier | losers (out/in) | "
                 + " | ".join(f"{t}, {p} ({len(member[(t, p)])})" for t, p in groups) + " |",
                 "|---" * (5 + len(groups)) + "|"]
        for name in rs[0]["scores"]:
            d = {k: np.array([np.mean(r["scores"][name][k]) for r in rs]) for k in SPLITS}
            per = " | ".join(f"{d['overall'][member[g]].mean() - best[g].max():+.3f}" for g in groups)
            lines.append(f"| {name} | {d['overall'].mean():+.3f} | {d['outlier'].mean():+.2f} | "
                         f"{d['inlier'].mean():+.2f} | {(d['outlier'] < -LOSS['outlier']).sum()}/"
                         f"{(d['inlier'] < -LOSS['inlier']).sum()} | {per} |")
        lines.append("| best fixed 1/tau in hindsight | | | | | "
                     + " | ".join(f"{GRID[int(np.argmax(best[g]))]:g}: {best[g].max():+.3f}" for g in groups) + " |")
        bad = [r for r in rs if r["base_check"]["mismatches"]]
        if bad:
            lines.append(f"\nBase of the refit differs from the saved run's by > 1e-6 on {len(bad)} configurations "
                         f"(largest {max(r['base_check']['largest'] for r in bad):.1e} pp); Prox − Base uses the "
                         "refit's own Base.")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from-json", required=True, help="saved runs of research/tau/tau_selection.py --json, comma-separated")
    p.add_argument("--neighbours", default="1,3,5", help="the m of the local fits (comma-separated)")
    p.add_argument("--weights", default="0.0625,0.125,0.25,0.5", help="the bias weights c (comma-separated)")
    p.add_argument("--json", help="also save every configuration's scores here (read back with --report)")
    p.add_argument("--report", action="store_true", help="--from-json names files saved by --json: report them")
    a = p.parse_args(argv)
    if a.report:
        results = [r for path in a.from_json.split(",") for r in json.loads(Path(path).read_text())]
    else:
        cache, results = table_loader(), []
        neighbours = [int(m) for m in a.neighbours.split(",")]
        weights = [float(c) for c in a.weights.split(",")]
        for row, seeds in saved_rows(a.from_json, "km", "local L²"):
            results.append(config_scores(row, seeds, cache, neighbours, weights))
        if a.json:
            replace_atomically(a.json, json.dumps(results).encode())
    print(report(results))


if __name__ == "__main__":
    main()
