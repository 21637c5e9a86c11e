"""KMeans' plug-in temperature, scored on saved runs (not a timed test).

    python research/tau/km_plugin.py --from-json out/ess_study.json,out/ess_fresh.json,... [--per-config] [--verdict]
        [--noise] [--groups] [--plot PNG]

Per query, the plug-in temperature takes the 1/tau whose weights minimize the paper's squared-error bound (appendix
E) with everything in it estimated from the training table: Σ_i w_i² var_i + c · L² · (Σ_i w_i φ_i)², var_i the
binomial variance of cluster i's mean accuracies, L² the accuracy's squared Lipschitz constant in the routing distance
fitted over cluster pairs (``proxray.routing.weights.bias_variance_stats`` / ``bias_variance_inv_tau``; ``temperature="bv"``
of the KMeans router). No CV: c is one constant (``CANDIDATES``, tested in that order, docs/prereg-km-plugin.md).

Runs saved before ``research/tau/tau_selection.py`` scored "bv:c" (its ``BV`` settings) hold no plug-in scores; this refits
each saved configuration and seed's test router (the same seed, so the same clusters; it raises unless Base's test
scores reproduce the saved ones to 1e-6) and scores the plug-in at every c of ``WEIGHTS`` beside KMeans' auto
(``ess-or-capped``, read from the saved CV curves; a run saved with ``--no-cv`` has none, and ess-or-capped's figures
are then over the configurations that have them, said so, "—" in a group without) and every fixed 1/tau of the grid.
Runs that hold "bv:" scores are read as they are. Printed: Prox − Base (mean over configurations of the seeds' mean)
and losers (> 0.3 pp outlier / > 0.5 pp inlier), overall and per table x protocol beside the best fixed 1/tau in
hindsight (~1 s per configuration and seed); ``--noise``: how many of the losers the seeds alone explain (``noise``);
``--groups``: per table x protocol the paired difference from the best fixed 1/tau with a bootstrap interval
(``groups``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tau_selection import (BV, D, LOSS, SETTINGS, SPLITS, _auto_pick, _deltas, against_fixed,  # noqa: E402
                           fit_test_run, fixed_deltas, group_axes, save_figure, test_splits)

from cv import GRID  # noqa: E402

BASE = GRID.index(float("inf"))
WEIGHTS = tuple(float(s[3:]) for s in BV)  # the bias weights c scored
CANDIDATES = (0.125, 0.25)  # docs/prereg-km-plugin.md: the first that passes its four conditions is adopted
AUTO = "ess-or-capped (KMeans' auto)"


def _name(c: float) -> str:
    return f"plug-in, c = {c:g}" + (f" (candidate {CANDIDATES.index(c) + 1})" if c in CANDIDATES else "")


def rule_of(values: dict, name: str):
    """A rule's entry of one split's ``values`` (a configuration's ``delta`` or ``per_seed``): "fixed 1/tau = g" is
    that 1/tau's column of the fixed grid (the last axis), any other name its own entry."""
    if name.startswith("fixed"):
        return values["fixed"][..., GRID.index(float(name.split("= ")[1]))]
    return values[name]


def saved_rows(paths: str, router: str, tag: str):
    """(row, its seeds) of every ``router`` configuration in the comma-separated saved runs of tau_selection.py
    --json, each announced on stderr with ``tag``."""
    for path in paths.split(","):
        saved = json.loads(Path(path).read_text())
        for row in (r for r in saved["rows"] if r["router"] == router):
            print(f"[{tag}] {path}: {row['table']} {row['protocol']} {','.join(row['outliers'])}", file=sys.stderr,
                  flush=True)
            yield row, saved.get("seeds", [42, 7, 99])


def scored(results: list, name: str):
    """(the results where rule ``name`` has a score, its label): ess-or-capped has none on runs saved with --no-cv,
    and its label then says over how many configurations its figures are."""
    have = [r for r in results if np.isfinite(rule_of(r["delta"]["overall"], name))]
    return have, name if len(have) == len(results) else f"{name}, {len(have)} of {len(results)} (with CV curves)"


def scored_on_all(results: list, name: str) -> bool:
    """Whether rule ``name`` has a score on every one of ``results`` (``scored``): where not, a group's figure or bar
    of it is left out rather than averaged over part of the group."""
    return len(scored(results, name)[0]) == len(results)


def refit_scores(X, acc, cost, table, row, seed: int, s: dict) -> dict:
    """{split: [Prox − Base at each c of WEIGHTS]} for one saved configuration and seed, from a refit."""
    from proxray.experiments.metrics import routing_score
    from cv import estimates_over

    sp, _, fitted = fit_test_run(table, X, acc, cost, "km", row["protocol"], row["outliers"], seed)
    got = {}
    for split, idx in test_splits(sp).items():
        c = None if cost is None else cost[idx]
        scores = [routing_score(a, k, acc[idx], c) for a, k in estimates_over(fitted, X[idx], [float("inf"), *BV])]
        if abs(scores[0] - s["test"][split][BASE]) > 1e-6:
            raise RuntimeError(f"{row['table']} {row['outliers']} seed {seed}: the refit's Base does not reproduce the "
                               "saved run (another machine or version, or another OMP_NUM_THREADS: KMeans' sums "
                               "depend on the number of threads)")
        got[split] = [v - scores[0] for v in scores[1:]]
    return got


def config_result(row, seeds, cache) -> dict:
    """Per split, Prox − Base (mean over seeds) of auto, each plug-in weight and each fixed 1/tau, for one row."""
    pick = _auto_pick([row])
    if len(row["seeds"][0]["test"]["overall"]) >= len(SETTINGS):  # saved with the BV settings: read, not refitted
        bv = {k: np.stack([_deltas(row, [SETTINGS.index(b)] * len(row["seeds"]), k) for b in BV], axis=1)
              for k in SPLITS}
    else:
        table, X, acc, cost = cache(row["table"])
        refits = [refit_scores(X, acc, cost, table, row, sd, s) for sd, s in zip(seeds, row["seeds"])]
        bv = {k: np.array([g[k] for g in refits]) for k in SPLITS}
    out, per_seed = {}, {}
    for k in SPLITS:
        seeds = {AUTO: (np.full(len(row["seeds"]), np.nan) if pick is None  # saved without CV curves (--no-cv)
                        else _deltas(row, [pick(s) for s in row["seeds"]], k))}
        seeds.update({_name(c): bv[k][:, j] for j, c in enumerate(WEIGHTS)})
        seeds["fixed"] = fixed_deltas(row, k)
        out[k] = {name: (v.mean(axis=0) if name == "fixed" else float(v.mean())) for name, v in seeds.items()}
        per_seed[k] = seeds
    return {"table": row["table"], "protocol": row["protocol"], "outliers": row["outliers"], "delta": out,
            "per_seed": per_seed, "n_seeds": len(row["seeds"])}


def report(results: list) -> str:
    """Markdown: each rule's Prox − Base over the configurations, losers, and per table x protocol."""
    groups = sorted({(r["table"], r["protocol"]) for r in results})
    of = lambda g: [r for r in results if (r["table"], r["protocol"]) == g]  # noqa: E731
    head = " | ".join(f"{t}, {p} ({len(of((t, p)))})" for t, p in groups)
    lines = [f"| rule | Δ outlier | Δ inlier | Δ overall | losers (out/in) | {head} |",
             "|---" * (5 + len(groups)) + "|"]
    rules = [AUTO, *(_name(c) for c in WEIGHTS), *(f"fixed 1/tau = {g:g}" for g in GRID)]
    for name in rules:
        get = (lambda r, k, name=name: rule_of(r["delta"][k], name))
        have, label = scored(results, name)
        if not have:
            continue
        d = {k: np.array([get(r, k) for r in have]) for k in SPLITS}
        per = " | ".join(f"{np.mean([get(r, 'overall') for r in of(g)]):+.3f}"
                         if scored_on_all(of(g), name) else "—" for g in groups)
        lines.append(f"| {label} | {d['outlier'].mean():+.2f} | {d['inlier'].mean():+.2f} | {d['overall'].mean():+.3f} "
                     f"| {(d['outlier'] < -LOSS['outlier']).sum()}/{(d['inlier'] < -LOSS['inlier']).sum()} | {per} |")
    best = []
    for g in groups:
        fixed = np.mean([r["delta"]["overall"]["fixed"] for r in of(g)], axis=0)
        best.append(f"{GRID[int(np.argmax(fixed))]:g}: {fixed.max():+.3f}")
    lines.append(f"| best fixed 1/tau in hindsight | | | | | {' | '.join(best)} |")
    return "\n".join(lines)


def per_config(results: list) -> str:
    """Markdown: per configuration, auto's and each candidate's Prox − Base (outlier, inlier, overall)."""
    lines = ["| table | protocol | outliers | auto: Δ outlier / inlier / overall | "
             + " | ".join(f"c = {c:g}: Δ outlier / inlier / overall" for c in CANDIDATES) + " |",
             "|---" * (4 + len(CANDIDATES)) + "|"]
    for r in results:
        d = r["delta"]
        lines.append(f"| {r['table']} | {r['protocol']} | {', '.join(r['outliers'])} | "
                     + " | ".join(" / ".join(f"{d[k][name]:+.2f}" if np.isfinite(d[k][name]) else "—" for k in SPLITS)
                                  for name in (AUTO, *(_name(c) for c in CANDIDATES))) + " |")
    return "\n".join(lines)


def verdict(results: list) -> str:
    """docs/prereg-km-plugin.md's four conditions for each candidate against auto, and which one is adopted."""
    def stats(name):
        d = {k: np.array([r["delta"][k][name] for r in results]) for k in SPLITS}
        return d["overall"].mean(), (d["outlier"] < -LOSS["outlier"]).sum(), (d["inlier"] < -LOSS["inlier"]).sum()

    mean0, out0, in0 = stats(AUTO)
    lines, adopted = [], None
    for c in CANDIDATES:
        name = _name(c)
        mean, lo, li = stats(name)
        changed = any(abs(r["delta"][k][name] - r["delta"][k][AUTO]) > 1e-9 for r in results for k in SPLITS)
        ok = [changed, lo <= out0 and li <= in0, mean >= mean0 - 0.03, lo + li < out0 + in0 or mean >= mean0]
        lines.append(f"c = {c:g}: mean {mean:+.3f} vs {mean0:+.3f}, losers {lo}/{li} vs {out0}/{in0}; conditions "
                     + ", ".join(f"{i + 1} {'met' if v else 'FAILED'}" for i, v in enumerate(ok)))
        if adopted is None and all(ok):
            adopted = c
    lines.append("adopted: " + ("none" if adopted is None else f"c = {adopted:g}"))
    return "\n".join(lines)


def groups(results: list, resamples: int = 10_000, seed: int = 0) -> str:
    """Markdown: per table x protocol (the target's unit), the first candidate and auto against the best fixed 1/tau
    in hindsight — tau_selection's ``against_fixed``: the paired difference with a 95 % bootstrap interval over the
    group's configurations (the best re-chosen in every resample) and the fixed 1/tau chosen without each
    configuration."""
    cand = _name(CANDIDATES[0])
    lines = [f"| table, protocol (configurations) | {cand} | {AUTO} | best fixed 1/tau (hindsight) | plug-in − best "
             "fixed [95 % bootstrap, re-chosen] | auto − best fixed [same] | fixed 1/tau chosen without the "
             "configuration |", "|---|---|---|---|---|---|---|"]
    rng = np.random.default_rng(seed)
    for g in sorted({(r["table"], r["protocol"]) for r in results}):
        rs = [r for r in results if (r["table"], r["protocol"]) == g]
        fixed = np.stack([r["delta"]["overall"]["fixed"] for r in rs])
        p, a = (against_fixed(np.array([r["delta"]["overall"][name] for r in rs]), fixed, rng, resamples)
                if scored_on_all(rs, name) else None  # auto: only with CV curves
                for name in (cand, AUTO))
        loo = "—" if p["loo"] is None else f"{p['loo']:+.3f}"
        auto = "—" if a is None else f"{a['auto']:+.3f}"
        diff = " | ".join("—" if x is None else
                          f"{x['auto'] - x['best_fixed']:+.3f} [{x['interval'][0]:+.3f}, {x['interval'][1]:+.3f}]"
                          for x in (p, a))
        lines.append(f"| {g[0]}, {g[1]} ({p['n']}) | {p['auto']:+.3f} | {auto} | {p['best']:g}: "
                     f"{p['best_fixed']:+.3f} | {diff} | {loo} |")
    return "\n".join(lines)


def noise(results: list, subset: int = 3) -> str:
    """Markdown: how much of the losing configurations the seeds explain. Per rule (auto, the plug-in at each c,
    fixed 1/tau from 10 to 200): the losing configurations at the seeds run, the number expected on ``subset`` seeds
    (the target's 42, 7, 99 are three) — per configuration the share of its ``subset``-seed subsets whose mean loses,
    summed — and the median standard error of a configuration's outlier mean; then each configuration the first
    candidate loses outlier AUC on, mean ± standard error over its seeds."""
    from itertools import combinations

    rules = [AUTO, *(_name(c) for c in WEIGHTS), *(f"fixed 1/tau = {g:g}" for g in (10.0, 20.0, 50.0, 100.0, 200.0))]

    lines = [f"| rule | Δ overall | losers (out/in) | expected on {subset} seeds (out/in) | median SE, outlier |",
             "|---|---|---|---|---|"]
    for name in rules:
        seen, expected, se = [0, 0], [0.0, 0.0], []
        have, label = scored(results, name)
        if not have:
            continue
        for r in have:
            for j, k in enumerate(("outlier", "inlier")):
                d = rule_of(r["per_seed"][k], name)
                seen[j] += d.mean() < -LOSS[k]
                expected[j] += np.mean([d[list(c)].mean() < -LOSS[k] for c in combinations(range(len(d)), subset)])
                if k == "outlier":
                    se.append(d.std(ddof=1) / np.sqrt(len(d)))
        overall = np.mean([rule_of(r["per_seed"]["overall"], name).mean() for r in have])
        lines.append(f"| {label} | {overall:+.3f} | {seen[0]}/{seen[1]} | {expected[0]:.1f}/{expected[1]:.1f} "
                     f"| {np.median(se):.2f} |")
    cand = _name(CANDIDATES[0])
    lines += ["", f"| losing outlier AUC under {cand} | Δ outlier, mean ± SE over the seeds | seeds' SD |",
              "|---|---|---|"]
    for r in results:
        d = r["per_seed"]["outlier"][cand]
        if d.mean() < -LOSS["outlier"]:
            lines.append(f"| {r['table']}, {r['protocol']}, {' + '.join(r['outliers'])} | {d.mean():+.2f} ± "
                         f"{d.std(ddof=1) / np.sqrt(len(d)):.2f} | {d.std(ddof=1):.2f} |")
    return "\n".join(lines)


def plot(results: list, path) -> None:
    """One panel per number of seeds (3-seed and 10-seed readings apart): per table x protocol, Prox − Base overall of
    ess-or-capped (where every configuration of the panel has its CV curves), the first candidate and the best fixed
    1/tau in hindsight; above each group the candidate − best fixed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r["n_seeds"] for r in results})
    fig, axes = plt.subplots(1, len(counts), figsize=(7 * len(counts), 4.8), squeeze=False)
    cand = _name(CANDIDATES[0])
    for ax, n in zip(axes[0], counts):
        rs = [r for r in results if r["n_seeds"] == n]
        groups = sorted({(r["table"], r["protocol"]) for r in rs})
        of = lambda g: [r for r in rs if (r["table"], r["protocol"]) == g]  # noqa: E731
        best = [np.mean([r["delta"]["overall"]["fixed"] for r in of(g)], axis=0) for g in groups]
        bars = ((AUTO.replace("(KMeans' auto)", "(the CV auto before)"), "C0", lambda g, b: np.mean(
                    [r["delta"]["overall"][AUTO] for r in of(g)])),
                (cand.replace(" (candidate 1)", " (auto now)"), "C1", lambda g, b: np.mean(
                    [r["delta"]["overall"][cand] for r in of(g)])),
                ("best fixed 1/τ in hindsight", "C2", lambda g, b: b.max()))
        if not scored_on_all(rs, AUTO):  # runs saved with --no-cv: no bar for ess-or-capped
            bars = bars[1:]
        for bi, (label, color, value) in enumerate(bars):
            ax.bar([gi + (bi - (len(bars) - 1) / 2) * 0.27 for gi in range(len(groups))],
                   [value(g, b) for g, b in zip(groups, best)], 0.27, color=color, label=label)
        for gi, (g, b) in enumerate(zip(groups, best)):
            v = np.mean([r["delta"]["overall"][cand] for r in of(g)])
            ax.annotate(f"{v - b.max():+.2f}\n(1/τ {GRID[int(np.argmax(b))]:g})", (gi, max(v, b.max(), 0.0)),
                        ha="center", va="bottom", fontsize=7)
        group_axes(ax, [(t, p, len(of((t, p)))) for t, p in groups],
                   f"KMeans, {n} seeds per configuration ({len(rs)} configurations)\n(labels: plug-in − best fixed "
                   "1/τ in hindsight, and that 1/τ)")
    save_figure(fig, path)


def table_loader():
    """name -> (table, its MiniLM embeddings, acc, cost), each shared table read and encoded once (the embedding
    cache makes a second run cheap)."""
    loaded = {}

    def cache(name):
        if name not in loaded:
            from proxray.embeddings.encoder import SentenceEncoder
            from proxray.data.table import RoutingTable

            t = RoutingTable.read(D / f"{name}.parquet")
            loaded[name] = (t, SentenceEncoder(progress=False).encode(t.prompts), *t.matrices())
        return loaded[name]

    return cache


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from-json", required=True, help="saved runs of research/tau/tau_selection.py --json, comma-separated")
    p.add_argument("--per-config", action="store_true", help="also auto against the CANDIDATES per configuration")
    p.add_argument("--verdict", action="store_true", help="also docs/prereg-km-plugin.md's conditions per candidate")
    p.add_argument("--noise", action="store_true", help="also how many losing configurations the seeds explain")
    p.add_argument("--groups", action="store_true", help="also per table x protocol against the best fixed 1/tau "
                   "with a bootstrap interval")
    p.add_argument("--plot", help="a PNG: per table x protocol, auto before, the plug-in and the best fixed 1/tau")
    a = p.parse_args(argv)
    cache = table_loader()
    results = []
    for row, seeds in saved_rows(a.from_json, "km", "plug-in"):  # runs saved with --no-cv: ess-or-capped left out
        results.append(config_result(row, seeds, cache))
    print(report(results))
    if a.per_config:
        print("\n" + per_config(results))
    if a.verdict:
        print("\n" + verdict(results))
    if a.noise:
        print("\n" + noise(results))
    if a.groups:
        print("\n" + groups(results))
    if a.plot:
        plot(results, a.plot)


if __name__ == "__main__":
    main()
