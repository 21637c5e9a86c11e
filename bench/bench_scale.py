"""Routing at 10⁴–10⁶ references: fit time, one-query latency (p50 / p99, one thread) and recall of each index, and
the whole routing path (static encoder + index + estimate + decision) against MiniLM's (not a timed test).

    python bench/bench_scale.py [--sizes 10000,100000,1000000] [--json research/benchmarks/scale.json]
                                [--figure docs/figures/scale_routing.png] [--knn-only] [--decision-tolerance T]

References are real: the prompts of the shared routing tables (../shared/data, ~27k), embedded with the static
encoder, and, past their number, copies of them jittered by Gaussian noise (σ = 0.02 a dimension, then
re-normalized; seeded), so the neighbourhoods keep the tables' structure. Queries are fresh jitters of other
prompts. Ten models' accuracy and cost per reference are random (they do not change the timings). Each router
fits with its defaults — ``KNNRouter(k=100)`` (index auto), ``KMeansRouter()`` — beside the exact kNN index up to
100k; latency is measured on one thread (faiss and BLAS), as the serving replicas search. The kNN router's recall@100
is reported twice: as its fit measured it (references held out of the index) and on the held queries (fresh texts),
and so is the share of its decisions (at the λ range its costs span) that differ from exact search's: what the index
is chosen by. ``--structureless`` draws references and queries at random on the sphere instead.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
M, SIGMA = 10, 0.02


def real_prompts() -> list:
    import pandas as pd

    prompts = []
    for name in ("routerdc7.parquet", "routerbench_slice.parquet", "bbh19_dev.parquet"):
        df = pd.read_parquet(SHARED / name, columns=["query_id", "prompt"]).drop_duplicates("query_id")
        prompts += list(df["prompt"])
    return list(dict.fromkeys(prompts))


def jittered(base: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` unit rows: ``base`` as it is first, then copies of its rows with N(0, SIGMA²) noise, re-normalized."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, base.shape[1]), np.float32)
    head = min(n, len(base))
    out[:head] = base[:head]
    for i in range(head, n, 100_000):
        j = slice(i, min(n, i + 100_000))
        rows = base[rng.integers(0, len(base), j.stop - i)]
        out[j] = rows + rng.normal(scale=SIGMA, size=rows.shape).astype(np.float32)
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def world(seed: int = 0):
    """(reference base embeddings, query texts, query embeddings, encoder)."""
    from proxray import SentenceEncoder

    enc = SentenceEncoder("static", progress=False, cache=False)  # as the endpoint encodes: no disk cache
    prompts = real_prompts()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(prompts))
    held = [prompts[i] for i in order[:300]]
    base = enc.encode([prompts[i] for i in order[300:]]).astype(np.float32)
    return base, held, enc


def unit_rows(rng, n: int, d: int) -> np.ndarray:
    """``n`` rows drawn uniformly on the unit sphere (no structure), in chunks."""
    out = np.empty((n, d), np.float32)
    for i in range(0, n, 100_000):
        j = slice(i, min(n, i + 100_000))
        out[j] = rng.normal(size=(j.stop - i, d)).astype(np.float32)
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def held_decisions(router, Xq) -> tuple[float, float]:
    """(share of decisions different from exact search's, their mean regret) for queries ``Xq`` at the router's λ range:
    what the index was chosen by, on fresh queries."""
    from proxray.routing.index import DecisionCheck, exact_neighbours
    from proxray.routing.knn import decision_lams

    R = router.reference_
    dist, idx = exact_neighbours(Xq, R, router.k_, router.metric, distances=True)

    def estimate(d, i):
        return router.estimate_at(router.temperature_.weights(d, None, router), i)

    check = DecisionCheck(estimate, decision_lams(router.cost_values_), dist, idx)
    return check.measure(*router.index_.search(Xq, router.k_))


def timed_queries(fn, queries, rounds=1):
    ts = []
    for _ in range(rounds):
        for q in queries:
            t = time.perf_counter()
            fn(q)
            ts.append(time.perf_counter() - t)
    ts = np.array(ts[len(ts) // 10:]) * 1e3  # the first tenth warms caches
    return round(float(np.median(ts)), 3), round(float(np.quantile(ts, 0.99)), 3)


def peak_gb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--json", default=None)
    p.add_argument("--figure", default=None)
    p.add_argument("--minilm", action="store_true", help="also time MiniLM's encode (the default encoder)")
    p.add_argument("--structureless", action="store_true", help="references and queries drawn at random on the "
                   "sphere (no neighbourhood structure): the kNN router alone")
    p.add_argument("--decision-tolerance", type=float, default=None,
                   help="the kNN router's decision_tolerance (default: the router's own)")
    p.add_argument("--knn-only", action="store_true", help="the kNN router alone")
    a = p.parse_args(argv)
    import faiss

    from proxray import KMeansRouter, KNNRouter
    from proxray.routing.index import single_thread

    base, held, enc = world()
    Xq = jittered(enc.encode(held).astype(np.float32), len(held), seed=1)
    rows = []
    if a.structureless:
        Xq = unit_rows(np.random.default_rng(1), len(held), base.shape[1])
    for n in [int(s) for s in a.sizes.split(",")]:
        R = unit_rows(np.random.default_rng(n), n, base.shape[1]) if a.structureless else jittered(base, n, seed=n)
        rng = np.random.default_rng(n)
        acc = (rng.uniform(size=(n, M)) < rng.uniform(0.2, 0.9, M)).astype(np.float32)
        cost = np.tile(rng.uniform(1e-6, 3e-5, M).astype(np.float32), (n, 1))
        knn = {"k": 100} if a.decision_tolerance is None else {"k": 100, "decision_tolerance": a.decision_tolerance}
        configs = [("knn", knn)] + ([("km", {})] if not (a.structureless or a.knn_only) else []) + \
            ([("knn-flat", {"k": 100, "index": "flat"})] if n <= 100_000 and not a.knn_only else [])
        for name, kw in configs:
            faiss.omp_set_num_threads(os.cpu_count() or 1)  # fitting uses the machine
            t0 = time.perf_counter()
            router = (KMeansRouter if name == "km" else KNNRouter)(**kw).fit(R, acc, cost, models=[f"m{i}" for i in range(M)])
            fit_s = time.perf_counter() - t0
            single_thread()
            route = timed_queries(lambda x: router.route(x[None, :], lam=1e3), Xq)
            path = timed_queries(lambda t: router.route(enc.encode([t]), lam=1e3), held)
            info = router.index_info_ if name.startswith("knn") else {"kind": f"{router.n_clusters} clusters"}
            if name == "knn":  # recall@100 and the decisions on the held queries too (fresh texts, not references)
                _, approx = router.index_.search(Xq, 100)
                _, exact = faiss.knn(Xq, router.reference_, 100, metric=faiss.METRIC_INNER_PRODUCT)
                differ, regret = held_decisions(router, Xq)
                info = {**info, "held_recall_at_k": round(float(np.mean(
                    [len(np.intersect1d(x, y)) / 100 for x, y in zip(approx, exact)])), 4),
                        "held_decisions_differ": round(differ, 5), "held_decision_regret": round(regret, 6)}
            row = {"n": n, "router": name, "fit_s": round(fit_s, 1), "route_p50_ms": route[0], "route_p99_ms": route[1],
                   "path_p50_ms": path[0], "path_p99_ms": path[1], "index": info, "peak_rss_gb": peak_gb()}
            rows.append(row)
            print(json.dumps(row), flush=True)
            router = None  # free it before the next fit
    single_thread()
    rows.append({"encoder": "static", "encode_p50_ms": timed_queries(lambda t: enc.encode([t]), held)[0]})
    if a.minilm:
        from proxray import SentenceEncoder

        mini = SentenceEncoder(progress=False, cache=False)
        rows.append({"encoder": "minilm", "encode_p50_ms": timed_queries(lambda t: mini.encode([t]), held)[0]})
    print(json.dumps(rows[-1]), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    if a.figure:
        plot(rows, a.figure)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, label in (("knn", "kNN, index auto"), ("knn-flat", "kNN, exact index"), ("km", "KMeans (K=32)")):
        rs = [r for r in rows if r.get("router") == name]
        if not rs:
            continue
        ns = [r["n"] for r in rs]
        ax1.plot(ns, [r["path_p50_ms"] for r in rs], "o-", label=label)
        ax2.plot(ns, [r["fit_s"] for r in rs], "o-", label=label)
    for ax, title in ((ax1, "routing path p50, one thread (ms)\nstatic encoder + index + estimate + decision"),
                      (ax2, "fit time (s), two cores")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("references")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    ax1.axhline(1.0, color="grey", ls=":", lw=1)
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
