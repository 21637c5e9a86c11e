"""KMeans' temperature per cluster, read off the CV folds of the tasks the cluster is made of (not a timed test).

    python research/tau/km_task_local.py --from-json out/ess_study.json,out/ess_fresh.json,... [--tasks routerdc7]

The two routerdc7 configurations that lose > 0.3 pp outlier under KMeans' auto on 10 seeds (research/tau-study.md: ess-or-capped)
lose because the test outliers prefer Base while the configuration's CV, averaged over its held-out training tasks,
prefers tilting. The CV's folds are kept apart in the saved runs (``folds_cv``): is the sign there, in the folds of
the tasks nearest the outliers? And can a rule use it — per KMeans cluster, the CV curve of the tasks its training
queries come from, weighted by their share of the cluster, so that a query gets the temperature that worked for
held-out tasks like its own?

For every KMeans configuration and seed of the saved runs (``research/tau/tau_selection.py --json``; their folds hold one
task each) this refits the test run's router (the same seed, so the same clusters), builds per cluster i the
outlier CV curve sum_t c_it · out_t (c_it: cluster i's share of training task t; out_t: task t's held-out CV curve,
mean over the repeats; optionally shrunk toward the whole CV's outlier curve with the weight n0 / (n_t + n0), n_t
the task's training queries), takes the whole CV's inlier curve beside it, and gives each test query the pick of its
nearest cluster. Variants (``VARIANTS``): the cluster's own ess-or-capped pick (``local``), the sharper of it and
auto's (``sharpen``: only ever toward Base), or Base where the cluster's curve puts Base above auto's pick
(``to-base``, optionally only where auto picked 1/tau >= 50); ``CANDIDATE`` is the one pre-registered in
docs/prereg-km-task-local.md, tested on ``--configs fresh9`` of research/tau/tau_selection.py on 10 seeds. Printed: Prox − Base (mean over configurations of
the seeds' mean) and losers (> 0.3 pp outlier / > 0.5 pp inlier), per table x protocol beside the best fixed 1/tau
in hindsight; ``--tasks TABLE``: each held-out task's CV gain over Base on the grid, for the configurations of that
table whose auto loses > 0.3 pp outlier, beside the test outliers' (~1 s per configuration and seed, no CV run).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tau_selection import _GRID_ESS, D, LOSS, SPLITS, ess_pick, fit_test_run, fixed_deltas, test_splits  # noqa: E402

from cv import GRID, SHIFT_CAP, estimates_over  # noqa: E402

G = len(GRID)  # picks below are indices into the grid followed by ess:3 (index G), the ESS_RULES' CV
BASE = GRID.index(float("inf"))
VARIANTS = {  # name -> (kind, n0, option)
    "ess-or-capped (KMeans' auto)": ("auto", 0, None),
    "per cluster: ess-or-capped on its tasks' CV": ("local", 0, None),
    "per cluster, its tasks' CV shrunk to the whole CV (n0 = 300)": ("local", 300, None),
    "the sharper of auto's and the cluster's pick": ("sharpen", 0, None),
    "the sharper of auto's and the cluster's pick (n0 = 300)": ("sharpen", 300, None),
    "Base where the cluster's CV puts Base above auto's pick": ("to-base", 0, 0.0),
    "the same, only where auto picked 1/tau >= 50": ("to-base", 0, 50.0),
}
AUTO_ROW = next(iter(VARIANTS))  # auto itself: every cluster at its pick
CANDIDATE = "the sharper of auto's and the cluster's pick (n0 = 300)"  # docs/prereg-km-task-local.md


def auto_pick(out_cv, in_cv) -> int:
    """KMeans' auto (ess-or-capped) on curves over the grid and then ess:3, as an index into them."""
    return ess_pick(out_cv, in_cv, cap=SHIFT_CAP)


def task_curves(folds: dict) -> tuple[list, np.ndarray]:
    """The saved folds (``folds_cv``, one held-out task per fold) as (tasks, (T, G + 1) outlier curves over the grid
    and ess:3, each task's mean over the repeats)."""
    out = np.asarray(folds["out"], dtype=float)[:, _GRID_ESS]
    held = [g[0] if len(g) == 1 else None for g in folds["groups"]]
    if None in held:
        raise ValueError("folds that hold out several tasks together: run research/tau/tau_selection.py with "
                         "--cv-fold-tasks 1")
    tasks = sorted(set(held))
    return tasks, np.stack([out[[k for k, t in enumerate(held) if t == task]].mean(axis=0) for task in tasks])


def cluster_curves(labels, train_tasks, tasks, out_t, out_all, n_clusters: int, n0: float = 0.0) -> np.ndarray:
    """Per cluster the outlier CV curve of the tasks its training queries come from, weighted by their share of the
    cluster: (K, S) = c @ out_t, c (K, T) the shares; each task's curve first shrunk toward the whole CV's ``out_all``
    with weight n0 / (n_t + n0). A cluster with no query of a held-out task (e.g. tasks too small to hold out) gets
    ``out_all``."""
    labels, train_tasks = np.asarray(labels), np.asarray(train_tasks)
    n_t = np.array([(train_tasks == t).sum() for t in tasks], dtype=float)
    shrunk = (n_t[:, None] * out_t + n0 * np.asarray(out_all)[None]) / (n_t[:, None] + n0)
    counts = np.stack([np.bincount(labels[train_tasks == t], minlength=n_clusters) for t in tasks], axis=1)
    total = counts.sum(axis=1, keepdims=True)
    shares = counts / np.maximum(total, 1)
    return np.where(total > 0, shares @ shrunk, np.asarray(out_all)[None])


def cluster_picks(kind: str, curves, in_all, auto: int, option) -> np.ndarray:
    """One pick per cluster (grid index, or G for ess:3) from its outlier curve and the whole CV's inlier curve."""
    if kind == "auto":
        return np.full(len(curves), auto)
    if kind == "to-base":
        if auto == G or (option is not None and GRID[auto] < option):
            return np.full(len(curves), auto)
        mean = (curves + np.asarray(in_all)[None]) / 2
        return np.where(mean[:, BASE] > mean[:, auto], BASE, auto)
    own = np.array([auto_pick(c, in_all) for c in curves])
    if kind == "local":
        return own
    # "sharpen": toward Base only; ess is not on the grid's line, so where either pick is ess auto's is kept
    return np.where((own == G) | (auto == G), auto, np.maximum(own, auto))


def run_seed(X, acc, cost, table, row, seed: int, s: dict) -> dict:
    """Prox − Base on each split for every variant, one seed of one saved configuration."""
    from proxray.experiments.metrics import routing_score

    sp, _, fitted = fit_test_run(table, X, acc, cost, "km", row["protocol"], row["outliers"], seed)
    tr = sp.base_train
    c = (lambda idx: None if cost is None else cost[idx])
    K = len(fitted.sizes_)
    tasks, out_t = task_curves(s["folds_cv"])
    out_all, in_all = (np.asarray(s[k], dtype=float)[_GRID_ESS] for k in ("out_cv", "in_cv"))
    auto = auto_pick(out_all, in_all)
    curves = {n0: cluster_curves(fitted.labels_, table.tasks[tr], tasks, out_t, out_all, K, n0)
              for n0 in {n0 for _, n0, _ in VARIANTS.values()}}  # one per shrinkage, not one per variant
    picks = {name: cluster_picks(kind, curves[n0], in_all, auto, option)
             for name, (kind, n0, option) in VARIANTS.items()}
    got = {}
    for split, idx in test_splits(sp).items():
        phi, _, _ = fitted.neighbourhood(X[idx])
        nearest = np.argmin(phi, axis=1)
        est = list(estimates_over(fitted, X[idx], [*GRID, "ess:3"]))
        A, C = np.stack([e[0] for e in est]), np.stack([e[1] for e in est])
        q = np.arange(len(idx))
        base = routing_score(A[BASE], C[BASE], acc[idx], c(idx))
        got[split] = {name: routing_score(A[p[nearest], q], C[p[nearest], q], acc[idx], c(idx)) - base
                      for name, p in picks.items()}
        saved = s["test"][split]
        if abs(got[split][AUTO_ROW] - (saved[_GRID_ESS[auto]] - saved[BASE])) > 1e-6:
            raise RuntimeError(f"{row['table']} {row['outliers']} seed {seed}: the refit does not reproduce the saved "
                               "run (another machine or version?)")
    return got


def report(results: list) -> str:
    """Markdown: each variant's Prox − Base over the configurations, losers, and per table x protocol."""
    groups = sorted({(r["table"], r["protocol"]) for r in results})
    head = " | ".join(f"{t}, {p} ({sum((r['table'], r['protocol']) == (t, p) for r in results)})" for t, p in groups)
    lines = [f"| rule | Δ outlier | Δ inlier | Δ overall | losers (out/in) | {head} |",
             "|---" * (5 + len(groups)) + "|"]
    best = []
    for t, p in groups:
        rs = [r for r in results if (r["table"], r["protocol"]) == (t, p)]
        fixed = np.mean([r["fixed"] for r in rs], axis=0)
        best.append(f"{GRID[int(np.argmax(fixed))]:g}: {fixed.max():+.3f}")
    for name in VARIANTS:
        d = {k: np.array([r["delta"][k][name] for r in results]) for k in SPLITS}
        per = " | ".join(f"{np.mean([r['delta']['overall'][name] for r in results if (r['table'], r['protocol']) == g]):+.3f}"
                         for g in groups)
        lines.append(f"| {name} | {d['outlier'].mean():+.2f} | {d['inlier'].mean():+.2f} | {d['overall'].mean():+.3f} "
                     f"| {(d['outlier'] < -LOSS['outlier']).sum()}/{(d['inlier'] < -LOSS['inlier']).sum()} | {per} |")
    lines.append(f"| best fixed 1/tau in hindsight | | | | | {' | '.join(best)} |")
    return "\n".join(lines)


def per_config(results: list) -> str:
    """Markdown: per configuration, auto's and ``CANDIDATE``'s Prox − Base (outlier, overall) and the runs (seeds)
    whose test scores the candidate changes."""
    auto = AUTO_ROW
    lines = ["| table | protocol | outliers | auto: Δ outlier / Δ overall | candidate: Δ outlier / Δ overall | runs changed |",
             "|---|---|---|---|---|---|"]
    for r in results:
        d = r["delta"]
        lines.append(f"| {r['table']} | {r['protocol']} | {', '.join(r['outliers'])} | {d['outlier'][auto]:+.2f} / "
                     f"{d['overall'][auto]:+.3f} | {d['outlier'][CANDIDATE]:+.2f} / {d['overall'][CANDIDATE]:+.3f} | "
                     f"{r['changed']} of {r['seeds']} |")
    return "\n".join(lines)


def task_table(row) -> str:
    """Each held-out task's CV outlier gain over Base on the grid (mean over seeds), beside the test outliers'."""
    seeds, per = row["seeds"], {}
    for s in seeds:
        tasks, out_t = task_curves(s["folds_cv"])
        for t, curve in zip(tasks, out_t):
            per.setdefault(t, []).append(curve[:G] - curve[BASE])
    test = fixed_deltas(row, "outlier").mean(axis=0)
    lines = [f"{row['table']} {row['protocol']} {'+'.join(row['outliers'])} ({len(seeds)} seeds): CV outlier gain "
             "over Base per held-out task", "| held-out task | " + " | ".join(f"{g:g}" for g in GRID) + " |",
             "|---" * (G + 1) + "|"]
    for t, v in sorted(per.items()):
        lines.append(f"| {t} | " + " | ".join(f"{x:+.2f}" for x in np.mean(v, axis=0)) + " |")
    lines.append("| **test outliers** | " + " | ".join(f"{x:+.2f}" for x in test) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from-json", required=True, help="saved runs of research/tau/tau_selection.py --json, comma-separated")
    p.add_argument("--per-config", action="store_true", help="also auto against CANDIDATE per configuration")
    p.add_argument("--tasks", metavar="TABLE", help="also the per-task CV of that table's losing configurations")
    a = p.parse_args(argv)
    from proxray.embeddings.encoder import SentenceEncoder
    from proxray.data.table import RoutingTable

    enc, cache, results = SentenceEncoder(progress=False), {}, []
    for path in a.from_json.split(","):
        saved = json.loads(Path(path).read_text())
        for row in (r for r in saved["rows"] if r["router"] == "km"):
            if "folds_cv" not in row["seeds"][0]:
                continue  # saved before the folds were kept
            if row["table"] not in cache:
                t = RoutingTable.read(D / f"{row['table']}.parquet")
                cache[row["table"]] = (t, enc.encode(t.prompts), *t.matrices())
            table, X, acc, cost = cache[row["table"]]
            print(f"[task-local] {path}: {row['table']} {row['protocol']} {','.join(row['outliers'])}", file=sys.stderr,
                  flush=True)
            seeds = saved.get("seeds", [42, 7, 99])
            got = [run_seed(X, acc, cost, table, row, sd, s) for sd, s in zip(seeds, row["seeds"])]
            results.append({"table": row["table"], "protocol": row["protocol"], "outliers": row["outliers"],
                            "changed": sum(any(abs(g[k][CANDIDATE] - g[k][AUTO_ROW]) > 1e-9 for k in SPLITS)
                                           for g in got), "seeds": len(got),
                            "delta": {k: {n: float(np.mean([g[k][n] for g in got])) for n in VARIANTS} for k in SPLITS},
                            "fixed": fixed_deltas(row, "overall").mean(axis=0)})
            # auto's outlier loss: its row of the refit, which run_seed checked against the saved scores
            if a.tasks == row["table"] and results[-1]["delta"]["outlier"][AUTO_ROW] < -LOSS["outlier"]:
                print(task_table(row) + "\n")
    print(report(results))
    if a.per_config:
        print("\n" + per_config(results))


if __name__ == "__main__":
    main()
