"""Which approximate index settings give a kNN router both a sub-millisecond route and exact search's decisions, at
10⁶ references of each of bench/bench_scale.py's shapes (a study: its figures choose the defaults of
``proxray.routing.index``; not a test).

    python research/index_settings.py --shape near-tie [--n 1000000] [--queries 1000] [--kinds hnsw,ivf] [--json F]

One ``KNNRouter(k=100, index="flat")`` is fitted on the references (its estimate is what decisions are made from);
then each setting is built over the same references — HNSW graphs of degree ``M`` 16 / 32 / 48 and build breadth
(``efConstruction``) 32 / 64, searched at breadths 64 … 324; inverted files of ~2 sqrt(n) lists searched at 4 … 64
lists — and asked for the 100 neighbours of fresh queries (the shape's own). Per setting: build seconds (two cores),
route p50 on one thread (search + estimate + decision), recall@100, the share of decisions (queries × the router's 16
λ) that differ from exact search's and their regret (utility lost by the exact estimates).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

import bench_scale  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=("structured", "near-tie", "isotropic"), default="near-tie")
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--json", default=None)
    p.add_argument("--kinds", default="hnsw,ivf", help="which indexes to build (comma-separated: hnsw, ivf)")
    a = p.parse_args(argv)
    kinds = set(a.kinds.split(","))
    import faiss

    from proxray import KNNRouter
    from proxray.routing import index as index_mod
    from proxray.routing.index import DecisionCheck, NeighborIndex, exact_neighbours, recall_at_k, single_thread
    from proxray.routing.knn import decision_lams

    base, held, enc = bench_scale.world()
    ties = bench_scale.NearTies(base.shape[1])
    R, acc, cost = bench_scale.references(a.shape, a.n, base, ties)
    if a.shape == "near-tie":
        Q = ties.draw(a.queries, seed=1)[0]
    elif a.shape == "isotropic":
        Q = bench_scale.unit_rows(np.random.default_rng(1), a.queries, base.shape[1])
    else:
        Q = bench_scale.jittered(enc.encode((held * (a.queries // len(held) + 1))[:a.queries]).astype(np.float32),
                                 a.queries, seed=1)
    router = KNNRouter(k=100, index="flat").fit(R, acc, cost, models=[f"m{i}" for i in range(acc.shape[1])])
    router.index_ = None  # the exact index's copy of the references is not needed here

    def estimate(d, i):
        return router.estimate_at(router.temperature_.weights(d, None, router), i)

    dist, exact = exact_neighbours(Q, R, 100, "cosine", distances=True)
    check = DecisionCheck(estimate, decision_lams(cost), dist, exact)
    rows = []

    def measure(setting: dict, index, knob: str, values) -> None:
        for v in values:
            (index.set_ef_search if knob == "ef_search" else index.set_nprobe)(v)
            faiss.omp_set_num_threads(os.cpu_count() or 1)
            d, i = index.search(Q, 100)
            differ, regret = check.measure(d, i)
            single_thread()
            ms = index_mod.route_ms(index, Q[:200], 100, check)
            row = {**setting, knob: v, "route_p50_ms": round(ms, 3), "recall_at_k": round(recall_at_k(i, exact), 4),
                   "decisions_differ": round(differ, 5), "decision_regret": round(regret, 6)}
            rows.append(row)
            print(json.dumps(row), flush=True)

    for m, efc in ((32, 32), (16, 32), (48, 32), (32, 64)) if "hnsw" in kinds else ():
        index_mod.EF_CONSTRUCTION = efc
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        t = time.perf_counter()
        index = NeighborIndex(R.shape[1], "cosine", "hnsw", hnsw_m=m)
        index.add(R)
        build = round(time.perf_counter() - t, 1)
        measure({"index": "hnsw", "hnsw_m": m, "ef_construction": efc, "build_s": build}, index, "ef_search",
                (64, 96, 144, 216, 324))
        index = None
    if "ivf" in kinds:
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        t = time.perf_counter()
        index = NeighborIndex(R.shape[1], "cosine", "ivf")
        index.add(R)
        build = round(time.perf_counter() - t, 1)
        measure({"index": "ivf", "nlist": index.nlist, "build_s": build}, index, "nprobe", (1, 2, 4, 8, 16, 32, 64))
    out = {"shape": a.shape, "n": a.n, "queries": a.queries, "machine": f"{os.cpu_count()} cores", "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
