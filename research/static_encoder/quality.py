"""Routing quality with the static encoder against MiniLM, on every shared routing table and both protocols.

    python -m research.static_encoder.quality [--out research/static_encoder/results.json] [--variants]

For each table × protocol × router (KMeans, kNN) it runs ``proxray.experiments.protocols.evaluate`` over seeds
42, 7, 99 with the routers' shipped ``auto`` temperatures, once on MiniLM's embeddings and once on the static
encoder's, and prints normalized AUC (accuracy where a table has no cost) of Base and Prox on the outlier,
inlier and overall test splits, with the standard deviation between seeds. ``--variants`` adds the
distillation settings tried (token pooling, no PCA, 128 dimensions, no frequency weighting) on overall AUC.
MiniLM's embeddings come from the on-disk cache (the first run encodes ~27k prompts: ~15 min on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
# (table, outlier task sets): the held-out sets of bench/real_tables.sh; --variants runs the first of each
GROUPS = [("routerbench_slice", [["mbpp"], ["arc-challenge"], ["winogrande"]]),
          ("bbh19_dev", [["boolean_expressions", "navigate", "object_counting"],
                         ["geometric_shapes", "ruin_names", "movie_recommendation", "salient_translation_error_detection"]]),
          ("routerdc7", [["gsm8k", "math_prealgebra"], ["humaneval", "mbpp", "javascript"]])]
PROTOCOLS = ["leave-task-out", "few-shot-outlier"]
ROUTERS = ["km", "knn"]
SEEDS = (42, 7, 99)


def static_vectors(prompts, recipe, source=None):
    from proxray.embeddings.encoder import _resolve
    from proxray.embeddings.static_encoder import StaticSession, distill

    return StaticSession(distill(_resolve(source)[1], recipe)).encode(list(prompts))


def encoders(variants: bool) -> dict:
    """name -> prompts -> X"""
    from proxray.embeddings.encoder import SentenceEncoder
    from proxray.embeddings.static_encoder import DEFAULT_RECIPE, Recipe

    out = {"MiniLM": lambda p: SentenceEncoder(progress=False).encode(p),
           "static": lambda p: SentenceEncoder("static", progress=False).encode(p)}
    if variants:
        for name, r in {"static, token pooling": Recipe(pooling="token"), "static, no PCA (384-d)": Recipe(dims=None),
                        "static, 128-d": Recipe(dims=128), "static, no SIF weights": Recipe(sif=0),
                        "static, SIF 1e-3": Recipe(sif=1e-3)}.items():
            assert r != DEFAULT_RECIPE
            out[name] = lambda p, r=r: static_vectors(p, r)
    return out


def run(variants: bool) -> list:
    from proxray.data.table import RoutingTable
    from proxray.experiments.protocols import evaluate

    rows = []
    for table_name, outlier_sets in GROUPS:
        table = RoutingTable.read(DATA / f"{table_name}.parquet")
        acc, cost = table.matrices()
        for enc_name, enc in encoders(variants).items():
            t0 = time.perf_counter()
            X = enc(table.prompts)
            print(f"{table_name}: {enc_name} encoded {len(X)} prompts in {time.perf_counter() - t0:.1f} s", flush=True)
            for outliers in outlier_sets[:1] if enc_name not in ("MiniLM", "static") else outlier_sets:
                for protocol in PROTOCOLS:
                    for router in ROUTERS:
                        res = evaluate(X, acc, cost, table.tasks, router=router, protocol=protocol,
                                       outliers=outliers, seeds=SEEDS)
                        rows.append({"table": table_name, "outliers": outliers, "protocol": protocol,
                                     "router": router, "encoder": enc_name, "metric": res["metric"],
                                     "splits": res["splits"], "std": res["std"]})
    return rows


def summary(rows: list) -> str:
    """The side-by-side table and the default rule's two figures (markdown)."""
    lines = ["| table | outliers | protocol | router | split | MiniLM Base | static Base | MiniLM Prox | static Prox |",
             "|---|---|---|---|---|---|---|---|---|"]
    key = lambda r: (r["table"], ",".join(r["outliers"]), r["protocol"], r["router"])  # noqa: E731
    by = {(key(r), r["encoder"]): r for r in rows}
    order = {t: i for i, (t, _) in enumerate(GROUPS)}
    cells = sorted({key(r) for r in rows}, key=lambda k: (order[k[0]], k[1], PROTOCOLS.index(k[2]), k[3]))
    fmt = lambda r, v, sp: f"{r['splits'][sp][v]:.2f} ± {r['std'][sp][v]:.2f}"  # noqa: E731
    for k in cells:
        m, s = by[(k, "MiniLM")], by[(k, "static")]
        for sp in ("outlier", "inlier", "overall"):
            lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {sp} | {fmt(m, 'base', sp)} | {fmt(s, 'base', sp)} | "
                         f"{fmt(m, 'prox', sp)} | {fmt(s, 'prox', sp)} |")
    lines += ["", "Static − MiniLM in pp per table × protocol (mean over its outlier sets, KMeans/kNN and Base/Prox):",
              ""]
    for name in sorted({r["encoder"] for r in rows} - {"MiniLM"}, key=lambda n: (n != "static", n)):
        for split in ("overall", "outlier"):
            gaps = {}
            for k in cells:
                if (k, name) in by:
                    d = [by[(k, name)]["splits"][split][v] - by[(k, "MiniLM")]["splits"][split][v]
                         for v in ("base", "prox")]
                    gaps.setdefault((k[0], k[2]), []).extend(d)
            g = {f"{t} / {p}": float(np.mean(d)) for (t, p), d in gaps.items()}
            lines.append(f"- **{name}**, {split}: mean {np.mean(list(g.values())):+.2f} pp; worst group "
                         f"{min(g.values()):+.2f} pp; " + ", ".join(f"{k} {v:+.2f}" for k, v in g.items()))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="research/static_encoder/results.json")
    p.add_argument("--summary", action="store_true", help="only print the summary of --out's rows")
    p.add_argument("--variants", action="store_true")
    a = p.parse_args(argv)
    if a.summary:
        print(summary(json.loads(Path(a.out).read_text())))
        return
    rows = run(a.variants)
    Path(a.out).write_text(json.dumps(rows, indent=1))
    print(summary(rows))


if __name__ == "__main__":
    main()
