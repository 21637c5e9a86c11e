"""Router decision time, memory, and overhead over a bare faiss search (not a timed test).

    python bench/bench_router.py [--sizes 10000,100000] [--dims 384,768] [--json out.json]

For each reference-set size n and dimension d (random unit vectors, 14 models), it times, per query,
excluding the encoder:
  * a bare faiss search of the same k on the same data (the floor),
  * KNNRouter.route (base and prox, k = 100) and KMeansRouter.route (base and prox, K = 32),
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

os.environ.setdefault("OMP_NUM_THREADS", "1")  # single thread: stable numbers (paper appendix C does the same)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import faiss  # noqa: E402
import numpy as np  # noqa: E402

from proxray import KMeansRouter, KNNRouter  # noqa: E402
from proxray.index import NeighborIndex, normalize, recall_at_k  # noqa: E402

M = 14


def per_query_ms(fn, queries, batch):
    """Median over repeats of the time per query, calling fn on batches of ``batch`` queries."""
    fn(queries[:batch])  # warm-up
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        for s in range(0, len(queries), batch):
            fn(queries[s:s + batch])
        runs.append((time.perf_counter() - t0) / len(queries) * 1e3)
    return float(np.median(runs))


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
    bare = knn_prox.index_._index
    for mode, batch, qs in (("single", 1, Q[:n_single]), ("batch256", 256, Q)):
        out[f"faiss_search_ms_{mode}"] = per_query_ms(lambda q: bare.search(q, 100), qs, batch)
        out[f"knn_prox_ms_{mode}"] = per_query_ms(lambda q: knn_prox.route(q, 1.0), qs, batch)
        out[f"knn_base_ms_{mode}"] = per_query_ms(lambda q: knn_base.route(q, 1.0), qs, batch)
        out[f"km_prox_ms_{mode}"] = per_query_ms(lambda q: km_prox.route(q, 1.0), qs, batch)
        out[f"km_base_ms_{mode}"] = per_query_ms(lambda q: km_base.route(q, 1.0), qs, batch)
        out[f"ratio_knn_prox_to_search_{mode}"] = out[f"knn_prox_ms_{mode}"] / out[f"faiss_search_ms_{mode}"]
    state = knn_prox.reference_.nbytes + knn_prox.acc_values_.nbytes + knn_prox.cost_values_.nbytes
    out["knn_state_mb_per_10k"] = state / n * 10_000 / 2**20
    out["embeddings_only_mb_per_10k"] = knn_prox.reference_.nbytes / n * 10_000 / 2**20
    _, exact = bare.search(Q[:500], 100)
    for kind in ("hnsw", "ivf"):
        idx = NeighborIndex(d, kind=kind)
        idx.add(X)
        _, approx = idx.search(Q[:500], 100)
        out[f"recall@100_{kind}"] = recall_at_k(approx, exact)
        out[f"{kind}_search_ms_batch256"] = per_query_ms(lambda q: idx.search(q, 100), Q, 256)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000")
    p.add_argument("--dims", default="384,768")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(42)
    rows = []
    for n in map(int, a.sizes.split(",")):
        for d in map(int, a.dims.split(",")):
            print(f"[bench] n={n} d={d} ...", file=sys.stderr, flush=True)
            rows.append(bench(n, d, rng))
    cols = ["n", "d", "faiss_search_ms_single", "knn_prox_ms_single", "ratio_knn_prox_to_search_single",
            "faiss_search_ms_batch256", "knn_prox_ms_batch256", "ratio_knn_prox_to_search_batch256",
            "knn_base_ms_batch256", "km_prox_ms_single", "km_prox_ms_batch256", "km_base_ms_batch256",
            "knn_state_mb_per_10k", "recall@100_hnsw", "hnsw_search_ms_batch256", "recall@100_ivf",
            "ivf_search_ms_batch256"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
