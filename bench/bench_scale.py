"""Routing at 10⁴–10⁶ references: fit time, one-query latency (p50 / p99 on one thread, and on 8 queries at once),
the decisions' regret against exact search and the recall of each index, and the whole routing path (static encoder +
index + estimate + decision) against MiniLM's (not a timed test).

    python bench/bench_scale.py [--sizes 10000,100000,1000000] [--shape structured|near-tie|isotropic]
                                [--json research/benchmarks/scale-structured.json] [--figure docs/figures/scale_routing.png]
                                [--knn-only] [--max-regret R] [--route-budget-ms B]

Three shapes of references (``--shape``):

* ``structured`` (default): real prompts — those of the shared routing tables (../shared/data, ~27k), embedded with
  the static encoder, and past their number copies of them jittered by Gaussian noise (σ = 0.02 a dimension, then
  re-normalized; seeded). Queries are fresh jitters of 300 other prompts. Ten models' accuracies are drawn per
  reference (each model its own rate), so every neighbour swapped moves an estimate.
* ``near-tie``: many small neighbouring topics — 20,000 topic centres in a 16-dimensional latent space, each reference
  a topic's centre plus latent noise, mapped to 384 dimensions by a fixed random map (plus a little noise there);
  each topic's ten accuracy rates are one shared profile whose models differ by a few points, tilted smoothly over
  the latent space, so neighbouring topics' best models differ little and near-ties are everywhere. Queries: 300
  fresh draws of the same topics.
* ``isotropic``: references and queries uniform on the sphere, labels drawn per reference (no structure at all).

Each router fits with its defaults — ``KNNRouter(k=100)`` (index auto), ``KMeansRouter()`` (structured only) — beside
the exact kNN index up to 100k; latency is measured on one thread (faiss and BLAS), as the serving replicas search,
and on 8 threads routing at once (each one query at a time). The kNN router's regret, share of changed decisions and
recall@100 against exact search are reported twice: as its fit measured them (references held out of the index) and
on the held queries (fresh texts); ``--json`` writes the rows, ``--print-json`` prints one line keyed by shape.
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


TOPICS, LATENT = 20_000, 16


class NearTies:
    """The near-tie-rich shape: topics in a low-dimensional latent space, mapped to ``d`` dimensions; every topic's
    accuracy profile one shared profile (models a few points apart) tilted smoothly over the latent space."""

    def __init__(self, d: int, seed: int = 7):
        rng = np.random.default_rng(seed)
        self.centres = rng.normal(size=(TOPICS, LATENT)).astype(np.float32)
        self.map = (rng.normal(size=(LATENT, d)) / np.sqrt(LATENT)).astype(np.float32)
        base = np.linspace(0.60, 0.72, M)  # the shared profile: neighbouring models 1.3 points apart
        tilt = np.tanh(self.centres @ rng.normal(size=(LATENT, M)) / np.sqrt(LATENT)).astype(np.float32)
        self.rates = np.clip(base[None, :] + 0.06 * tilt, 0.0, 1.0)  # (topics, M)
        self.cost = np.linspace(1e-6, 3e-5, M).astype(np.float32)  # the better the dearer: the λ range matters

    def draw(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows (n, d) unit, topics (n,)), in chunks."""
        rng = np.random.default_rng(seed)
        topic = rng.integers(0, TOPICS, n)
        out = np.empty((n, self.map.shape[1]), np.float32)
        for i in range(0, n, 100_000):
            j = slice(i, min(n, i + 100_000))
            z = self.centres[topic[j]] + 0.3 * rng.normal(size=(j.stop - i, LATENT)).astype(np.float32)
            out[j] = z @ self.map + 0.05 * rng.normal(size=(j.stop - i, self.map.shape[1])).astype(np.float32)
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out, topic


def references(shape: str, n: int, base: np.ndarray, ties: NearTies):
    """(R (n, d), acc (n, M), cost (n, M)) of a shape."""
    rng = np.random.default_rng(n)
    if shape == "near-tie":
        R, topic = ties.draw(n, seed=n)
        acc = (rng.uniform(size=(n, M)) < ties.rates[topic]).astype(np.float32)
        return R, acc, np.tile(ties.cost, (n, 1))
    R = unit_rows(rng, n, base.shape[1]) if shape == "isotropic" else jittered(base, n, seed=n)
    acc = (rng.uniform(size=(n, M)) < rng.uniform(0.2, 0.9, M)).astype(np.float32)
    cost = np.tile(rng.uniform(1e-6, 3e-5, M).astype(np.float32), (n, 1))
    return R, acc, cost


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


def concurrent_queries(fn, queries, threads: int = 8, rounds: int = 2) -> dict:
    """Each of ``threads`` threads (one faiss thread each) routes the queries one at a time: per-query p50 / p99 (ms)
    and queries a second in all."""
    from concurrent.futures import ThreadPoolExecutor

    from proxray.routing.index import single_thread

    def worker(offset):
        single_thread()
        ts = []
        for q in list(queries[offset:]) * rounds:
            t = time.perf_counter()
            fn(q)
            ts.append(time.perf_counter() - t)
        return ts

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(worker, range(threads)))
    wall = time.perf_counter() - t0
    total = sum(len(p) for p in parts)  # every query routed counts toward the rate; the first tenth of each not timed
    ts = np.concatenate([np.array(p[len(p) // 10:]) for p in parts]) * 1e3
    return {"threads": threads, "p50_ms": round(float(np.median(ts)), 3), "p99_ms": round(float(np.quantile(ts, 0.99)), 3),
            "queries_s": round(total / wall, 1)}


def peak_gb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--shape", choices=("structured", "near-tie", "isotropic"), default="structured")
    p.add_argument("--json", default=None, help="write the rows to this file")
    p.add_argument("--print-json", action="store_true", help="print one line at the end: {shape: [rows]}")
    p.add_argument("--figure", default=None)
    p.add_argument("--minilm", action="store_true", help="also time MiniLM's encode (the default encoder)")
    p.add_argument("--max-regret", type=float, default=None, help="the kNN router's max_regret (default its own)")
    p.add_argument("--route-budget-ms", type=float, default=None, help="the kNN router's route_budget_ms")
    p.add_argument("--knn-only", action="store_true", help="the kNN router alone")
    a = p.parse_args(argv)
    import faiss

    from proxray import KMeansRouter, KNNRouter
    from proxray.routing.index import single_thread

    base, held, enc = world()
    ties = NearTies(base.shape[1])
    Xq = {"structured": lambda: jittered(enc.encode(held).astype(np.float32), len(held), seed=1),
          "near-tie": lambda: ties.draw(len(held), seed=1)[0],
          "isotropic": lambda: unit_rows(np.random.default_rng(1), len(held), base.shape[1])}[a.shape]()
    texts = a.shape == "structured"  # the path (encoder + route) is timed on the held texts of the real prompts
    rows = []
    for n in [int(s) for s in a.sizes.split(",")]:
        R, acc, cost = references(a.shape, n, base, ties)
        knn = {"k": 100, **({} if a.max_regret is None else {"max_regret": a.max_regret}),
               **({} if a.route_budget_ms is None else {"route_budget_ms": a.route_budget_ms})}
        configs = [("knn", knn)] + ([("km", {})] if texts and not a.knn_only else []) + \
            ([("knn-flat", {"k": 100, "index": "flat"})] if n <= 100_000 and not a.knn_only else [])
        for name, kw in configs:
            faiss.omp_set_num_threads(os.cpu_count() or 1)  # fitting uses the machine
            t0 = time.perf_counter()
            router = (KMeansRouter if name == "km" else KNNRouter)(**kw).fit(R, acc, cost, models=[f"m{i}" for i in range(M)])
            fit_s = time.perf_counter() - t0
            single_thread()
            route = timed_queries(lambda x: router.route(x[None, :], lam=1e3), Xq)
            row = {"shape": a.shape, "n": n, "router": name, "fit_s": round(fit_s, 1), "route_p50_ms": route[0],
                   "route_p99_ms": route[1],
                   "route_8_at_once": concurrent_queries(lambda x: router.route(x[None, :], lam=1e3), Xq)}
            if texts:
                row["path_p50_ms"], row["path_p99_ms"] = timed_queries(lambda t: router.route(enc.encode([t]), lam=1e3), held)
            info = router.index_info_ if name.startswith("knn") else {"kind": f"{router.n_clusters} clusters"}
            if name == "knn":  # recall@100 and the decisions on the held queries too (fresh texts, not references)
                info = {k: v for k, v in info.items() if k != "trials"}
                row["trials"] = router.index_info_.get("trials")
                _, approx = router.index_.search(Xq, 100)
                _, exact = faiss.knn(Xq, router.reference_, 100, metric=faiss.METRIC_INNER_PRODUCT)
                differ, regret = held_decisions(router, Xq)
                info = {**info, "held_recall_at_k": round(float(np.mean(
                    [len(np.intersect1d(x, y)) / 100 for x, y in zip(approx, exact)])), 4),
                        "held_decisions_differ": round(differ, 5), "held_decision_regret": round(regret, 6)}
            row.update(index=info, peak_rss_gb=peak_gb())
            rows.append(row)
            print(json.dumps(row), flush=True)
            router = None  # free it before the next fit
        R = acc = cost = None
    single_thread()
    rows.append({"encoder": "static", "encode_p50_ms": timed_queries(lambda t: enc.encode([t]), held)[0]})
    if a.minilm:
        from proxray import SentenceEncoder

        mini = SentenceEncoder(progress=False, cache=False)
        rows.append({"encoder": "minilm", "encode_p50_ms": timed_queries(lambda t: mini.encode([t]), held)[0]})
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    if a.figure:
        plot(rows, a.figure)
    print(json.dumps({a.shape: rows}) if a.print_json else json.dumps(rows[-1]), flush=True)


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
