"""Does the serving path's fast encoder route as well as the encoder the router was fitted with?
(not a timed test)

    python bench/bench_encoder.py [--json out/bench_encoder.json] [--backends torch,onnx,onnx-int8]

For every configuration of bench/real_tables.sh (the shared tables, both protocols, KMeans and kNN) and
seeds 42, 7, 99: fits KM-Prox / kNN-Prox (1/tau = 20) and Base on the training split embedded by
sentence-transformers (torch), as ``proxray fit`` does, then routes the test split embedded by each
backend (torch, onnx, onnx-int8), as the ingress does, and prints the normalized AUC (accuracy without
cost) on the outlier / inlier splits: per backend, its mean difference to torch and the largest one
over configurations. Also the cosine of each backend's vectors to torch's and the encoding rate.
Embeddings are cached per backend on disk (the first run encodes ~27k prompts per backend).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "research" / "tau"))
from tau_selection import CONFIGS, D, SEEDS  # noqa: E402  (the same configurations as the tau study)

from proxray.embeddings.encoder import BACKENDS, SentenceEncoder  # noqa: E402
from proxray.experiments.protocols import protocol_split  # noqa: E402
from proxray.experiments.metrics import routing_score  # noqa: E402
from proxray.data.table import RoutingTable  # noqa: E402
from proxray.routing.registry import make_router  # noqa: E402


def embed_all(tables, backends):
    X, info = {}, {}
    for b in backends:
        enc = SentenceEncoder(backend=b, progress=True)
        t0 = time.time()
        X[b] = {name: enc.encode(t.prompts) for name, t in tables.items()}
        info[b] = {"seconds": time.time() - t0}
    for b in backends:
        cos = np.concatenate([(X[b][n] * X["torch"][n]).sum(1) for n in tables])
        info[b].update({"cos_min": float(cos.min()), "cos_mean": float(cos.mean())})
    return X, info


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated; torch is always included")
    a = p.parse_args(argv)
    backends = ["torch"] + [b for b in a.backends.split(",") if b in BACKENDS and b != "torch"]
    tables = {name: RoutingTable.read(D / f"{name}.parquet") for name in sorted({c[0] for c in CONFIGS})}
    X, info = embed_all(tables, backends)
    for b, i in info.items():
        print(f"{b}: cosine to torch min {i['cos_min']:.4f} mean {i['cos_mean']:.5f}; "
              f"{i['seconds']:.0f} s (0 s when cached)", flush=True)
    rows = []
    for name, router, protocol, outliers in CONFIGS:
        t = tables[name]
        acc, cost = t.matrices()
        for seed in SEEDS:
            sp = protocol_split(t.tasks, outliers, protocol, seed)
            hp = {"n_clusters": 32, "k": 100, "random_state": seed}
            tr = sp.base_train
            c = (lambda idx: None if cost is None else cost[idx])
            fitted = {w: make_router(router, w, hp).fit(X["torch"][name][tr], acc[tr], c(tr)) for w in ("prox", "base")}
            for split, idx in (("outlier", sp.test[sp.test_outlier]), ("inlier", sp.test[~sp.test_outlier])):
                for w, r in fitted.items():
                    s = {b: routing_score(*r.estimate(X[b][name][idx]), acc[idx], c(idx)) for b in backends}
                    rows.append({"table": name, "router": router, "protocol": protocol, "outliers": outliers,
                                 "seed": seed, "split": split, "weighting": w, **s})
        print(f"{name} {router} {protocol} {','.join(outliers)}: done", flush=True)
    print("\n| backend | router | split | mean Δ AUC vs torch (pp) | largest |Δ| of one configuration (mean of seeds) "
          "| largest |Δ| of one seed | configurations × seeds |")
    print("|---|---|---|---|---|---|---|")
    for b in backends[1:]:
        for router in ("km", "knn"):
            for split in ("outlier", "inlier"):
                mine = [r for r in rows if r["router"] == router and r["split"] == split and r["weighting"] == "prox"]
                d = np.array([r[b] - r["torch"] for r in mine])  # routing_score is in % already: Δ in pp
                per_cfg = {}
                for r, x in zip(mine, d):
                    per_cfg.setdefault((r["table"], r["protocol"], tuple(r["outliers"])), []).append(x)
                cfg_max = max(abs(float(np.mean(v))) for v in per_cfg.values())
                print(f"| {b} | {router}-Prox | {split} | {d.mean():+.3f} | {cfg_max:.3f} | {np.abs(d).max():.3f} | {len(d)} |")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"encoders": info, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
