"""Which way of choosing 1/tau works? Compares, on the real tables, the training-only rules of
``proxray.tuning`` with every fixed 1/tau of the grid, against the test split (not a timed test).

    python bench/tau_selection.py [--json out/tau_selection.json]

For every configuration of bench/real_tables.sh and seeds 42, 7, 99 it computes the leave-one-task-out
CV curves on the training set, then the test scores of Prox at every 1/tau of the grid (Base is the
grid's limit: inf for KMeans, 0 for kNN). Printed: for each rule and each fixed 1/tau, the mean over
configurations of Prox − Base on the outlier, inlier and overall splits, and how many configurations
lose more than 0.5 pp of inlier score.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from proxray.embed import SentenceEncoder
from proxray.experiments import protocol_split
from proxray.metrics import routing_score
from proxray.table import RoutingTable
from proxray.tuning import GRID, cv_curves, make_router, select_inv_tau

D = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CONFIGS = (
    [("routerbench_slice", r, p, [o]) for o in ("mbpp", "arc-challenge", "winogrande")
     for r, p in (("km", "leave-task-out"), ("knn", "few-shot-outlier"))]
    + [("bbh19_dev", r, p, o) for o in (["boolean_expressions", "navigate", "object_counting"],
                                         ["geometric_shapes", "ruin_names", "movie_recommendation",
                                          "salient_translation_error_detection"])
       for p in ("leave-task-out", "few-shot-outlier") for r in ("km", "knn")]
    + [("routerdc7", "km", "leave-task-out", ["gsm8k", "math_prealgebra"]),
       ("routerdc7", "knn", "few-shot-outlier", ["gsm8k", "math_prealgebra"]),
       ("routerdc7", "km", "leave-task-out", ["humaneval", "mbpp", "javascript"])])
SEEDS = (42, 7, 99)


def run_config(table, X, acc, cost, router, protocol, outliers, seed):
    sp = protocol_split(table.tasks, outliers, protocol, seed)
    hp = {"n_clusters": 32, "k": 100, "random_state": seed}
    tr = sp.base_train
    c = (lambda idx: None if cost is None else cost[idx])
    out_cv, in_cv = cv_curves(X[tr], acc[tr], c(tr), table.tasks[tr], router, hp, protocol, 25, seed)
    fitted = make_router(router, "prox", hp).fit(X[tr], acc[tr], c(tr))
    test = {"outlier": sp.test[sp.test_outlier], "inlier": sp.test[~sp.test_outlier], "overall": sp.test}
    scores = {k: [] for k in test}
    for g in GRID:
        fitted.inv_tau_ = float(g)
        for k, idx in test.items():
            a_hat, c_hat = fitted.estimate(X[idx])
            scores[k].append(routing_score(a_hat, c_hat, acc[idx], c(idx)))
    return {"out_cv": out_cv.tolist(), "in_cv": in_cv.tolist(), "test": scores}


def summarize(rows):
    grid = np.array(GRID)
    lines = ["| rule | Δ outlier (pp) | Δ inlier (pp) | Δ overall (pp) | configs losing > 0.5 pp inlier |", "|---|---|---|---|---|"]

    def line(name, pick):
        d = {k: [] for k in ("outlier", "inlier", "overall")}
        losers = 0
        for r in rows:
            base = int(np.flatnonzero(np.isinf(grid))[0]) if r["router"] == "km" else 0
            per_seed = [pick(r, s) for s in r["seeds"]]
            for k in d:
                d[k].append(np.mean([s["test"][k][g] - s["test"][k][base] for s, g in zip(r["seeds"], per_seed)]))
            losers += d["inlier"][-1] < -0.5
        lines.append(f"| {name} | {np.mean(d['outlier']):+.2f} | {np.mean(d['inlier']):+.2f} | "
                     f"{np.mean(d['overall']):+.2f} | {losers}/{len(rows)} |")
        return np.mean(d["overall"])

    for rule in ("mean", "guarded"):
        line(f"auto ({rule})", lambda r, s, rule=rule: int(np.flatnonzero(grid == select_inv_tau(
            np.array(s["out_cv"]), np.array(s["in_cv"]), r["router"], GRID, rule))[0]))
    for gi, g in enumerate(GRID):
        line(f"fixed 1/tau = {g:g}", lambda r, s, gi=gi: gi)
    return "\n".join(lines)


def report(rows):
    for router in ("km", "knn"):
        sel = [r for r in rows if r["router"] == router]
        print(f"\n{router}: {len(sel)} configurations x {len(SEEDS)} seeds, Prox - Base on the test split")
        print(summarize(sel))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    p.add_argument("--from-json", default=None, help="only summarize a saved run")
    a = p.parse_args(argv)
    if a.from_json:
        report(json.loads(Path(a.from_json).read_text())["rows"])
        return
    enc = SentenceEncoder(progress=False)
    rows, cache = [], {}
    for name, router, protocol, outliers in CONFIGS:
        if name not in cache:
            t = RoutingTable.read(D / f"{name}.parquet")
            cache[name] = (t, enc.encode(t.prompts), *t.matrices())
        table, X, acc, cost = cache[name]
        print(f"[tau] {name} {router} {protocol} {','.join(outliers)}", file=sys.stderr, flush=True)
        seeds = [run_config(table, X, acc, cost, router, protocol, outliers, s) for s in SEEDS]
        rows.append({"table": name, "router": router, "protocol": protocol, "outliers": outliers, "seeds": seeds})
    report(rows)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"grid": [str(g) for g in GRID], "rows": rows}))


if __name__ == "__main__":
    main()
