"""Router decision time, memory, and overhead over a bare faiss search (not a timed test).

    python bench/bench_router.py [--sizes 10000,100000] [--dims 384,768] [--json out.json]

For each reference-set size n and dimension d (random unit vectors, 14 models), it times, per query,
excluding the encoder:
  * a bare faiss search of the same k on the same data (the floor),
  * KNNRouter.route (base and prox, k = 100) and KMeansRouter.route (base and prox, K = 32; and prox with
    KMeans' auto temperature, the plug-in at c = 0.125, ``temperature="auto"``),
single-threaded one query at a time and batched (256 queries per call), and reports the ratio of
kNN-Prox route() to the bare search (target <= 1.3), the memory of the fitted kNN state per 10k
reference queries, and the recall of the approximate indexes against the exact one.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # single thread: stable numbers (paper appendix C does the same)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import faiss  # noqa: E402
import numpy as np  # noqa: E402

from proxray import KMeansRouter, KNNRouter  # noqa: E402
from proxray.routing.index import NeighborIndex, normalize, recall_at_k  # noqa: E402

M = 14


def per_query_ms(fns: dict, queries, batch, rounds=5):
    """Median time per query (ms) of each function, calling it on batches of ``batch`` queries.
    The functions take turns round by round, so drift in the machine hits all of them alike."""
    for fn in fns.values():
        fn(queries[:batch])  # warm-up
    runs = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for s in range(0, len(queries), batch):
                fn(queries[s:s + batch])
            runs[name].append((time.perf_counter() - t0) / len(queries) * 1e3)
    return {name: float(np.median(v)) for name, v in runs.items()}


def bench(n, d, rng, n_single=300, n_batch=2048):
    X = normalize(rng.normal(size=(n, d)).astype(np.float32))
    acc = (rng.uniform(size=(n, M)) < 0.6).astype(np.float64)
    cost = rng.uniform(1e-5, 1e-3, size=(n, M))
    Q = normalize(rng.normal(size=(n_batch, d)).astype(np.float32))
    out = {"n": n, "d": d}
    knn_prox = KNNRouter(k=100, weighting="prox").fit(X, acc, cost)
    knn_base = KNNRouter(k=100, weighting="base").fit(X, acc, cost)
    km_prox = KMeansRouter(n_clusters=32, weighting="prox", n_init=1).fit(X[:20000], acc[:20000], cost[:20000])
    km_base = KMeansRouter(n_clusters=32, weighting="base", n_init=1).fit(X[:20000], acc[:20000], cost[:20000])
    km_plugin = KMeansRouter(n_clusters=32, n_init=1, temperature="auto").fit(
        X[:20000], acc[:20000], cost[:20000])
    bare = knn_prox.index_._index
    for mode, batch, qs in (("single", 1, Q[:n_single]), ("batch256", 256, Q)):
        t = per_query_ms({"faiss_search": lambda q: bare.search(q, 100), "knn_prox": lambda q: knn_prox.route(q, 1.0),
                          "knn_base": lambda q: knn_base.route(q, 1.0), "km_prox": lambda q: km_prox.route(q, 1.0),
                          "km_base": lambda q: km_base.route(q, 1.0),
                          "km_plugin": lambda q: km_plugin.route(q, 1.0)}, qs, batch)
        out.update({f"{name}_ms_{mode}": v for name, v in t.items()})
        out[f"ratio_knn_prox_to_search_{mode}"] = t["knn_prox"] / t["faiss_search"]
    state = knn_prox.reference_.nbytes + knn_prox.acc_values_.nbytes + knn_prox.cost_values_.nbytes
    out["knn_state_mb_per_10k"] = state / n * 10_000 / 2**20
    out["embeddings_only_mb_per_10k"] = knn_prox.reference_.nbytes / n * 10_000 / 2**20
    _, exact = bare.search(Q[:500], 100)
    for kind in ("hnsw", "ivf"):
        idx = NeighborIndex(d, kind=kind)
        idx.add(X)
        _, approx = idx.search(Q[:500], 100)
        out[f"recall@100_{kind}"] = recall_at_k(approx, exact)
        out[f"{kind}_search_ms_batch256"] = per_query_ms({"s": lambda q: idx.search(q, 100)}, Q, 256, rounds=3)["s"]
    return out


def real_recall(k=100):
    """Recall of the approximate indexes on real MiniLM embeddings of the shared tables' prompts
    (from the embedding cache, or encoded once): 2,000 held-out queries against the rest."""
    from proxray.embeddings.encoder import SentenceEncoder
    from proxray.data.table import RoutingTable

    data = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    prompts = []
    for name in ("routerdc7", "bbh19_dev", "routerbench_slice"):
        prompts += RoutingTable.read(data / f"{name}.parquet").prompts
    X = SentenceEncoder(progress=False).encode(prompts)
    perm = np.random.default_rng(0).permutation(len(X))
    R, Q = X[perm[2000:]], X[perm[:2000]]
    exact = NeighborIndex(X.shape[1])
    exact.add(R)
    _, e = exact.search(Q, k)
    out = {"n": len(R), "d": X.shape[1]}
    for kind, kw in (("hnsw", {}), ("ivf", {"nprobe": 16}), ("ivf_nprobe64", {"nprobe": 64})):
        idx = NeighborIndex(X.shape[1], kind=kind.split("_")[0], **kw)
        idx.add(R)
        _, a = idx.search(Q, k)
        out[f"recall@{k}_{kind}"] = recall_at_k(a, e)
        out[f"{kind}_ms_batch256"] = per_query_ms({"s": lambda q: idx.search(q, k)}, Q, 256, rounds=3)["s"]
    out["flat_ms_batch256"] = per_query_ms({"s": lambda q: exact.search(q, k)}, Q, 256, rounds=3)["s"]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000")
    p.add_argument("--dims", default="384,768")
    p.add_argument("--json", default=None)
    p.add_argument("--real", action="store_true", help="also measure index recall on real MiniLM embeddings")
    a = p.parse_args(argv)
    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(42)
    rows = []
    for n in map(int, a.sizes.split(",")):
        for d in map(int, a.dims.split(",")):
            print(f"[bench] n={n} d={d} ...", file=sys.stderr, flush=True)
            rows.append(bench(n, d, rng, n_single=300 if n <= 10000 else 100, n_batch=2048 if n <= 10000 else 1024))
    cols = ["n", "d", "faiss_search_ms_single", "knn_prox_ms_single", "ratio_knn_prox_to_search_single",
            "faiss_search_ms_batch256", "knn_prox_ms_batch256", "ratio_knn_prox_to_search_batch256",
            "knn_base_ms_batch256", "km_prox_ms_single", "km_prox_ms_batch256", "km_base_ms_batch256",
            "km_plugin_ms_single", "km_plugin_ms_batch256",
            "knn_state_mb_per_10k", "recall@100_hnsw", "hnsw_search_ms_batch256", "recall@100_ivf",
            "ivf_search_ms_batch256"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    real = None
    if a.real:
        print("[bench] recall on real embeddings ...", file=sys.stderr, flush=True)
        real = real_recall()
        print("\nreal MiniLM embeddings of ../shared/data prompts: " + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in real.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"synthetic": rows, "real": real}, f, indent=2)


if __name__ == "__main__":
    main()
