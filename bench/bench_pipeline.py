"""The pipeline at 10⁵–10⁶ rows on this machine (not a timed test): the evaluation job, the table's consolidation,
``proxray fit`` and the monitor's per-report scoring, each with its time and peak memory.

    python bench/bench_pipeline.py job --queries 100000 [--models 10]
    python bench/bench_pipeline.py fit --queries 100000 [--models 10] [--router knn]
    python bench/bench_pipeline.py monitor --references 100000 [--reports 2000]
    ... [--json research/benchmarks/pipeline-<part>.json]

* ``job``: the evaluation job (Ray Data, the sim engine, one replica a model, batches of 256) on ``--queries``
  synthetic queries × ``--models`` models: wall time, rows/s in all and per model, then the consolidation of its
  parts (read, keyed, written) again in a process of its own for its time and peak memory.
* ``fit``: a table of ``--queries`` distinct prompts (the shared tables' real prompts, numbered past their count) ×
  ``--models`` models, written as parquet; ``proxray fit --encoder static`` on it in a process of its own, twice (the
  second run reads the table's embeddings from the on-disk cache): wall time and peak memory of each.
* ``monitor``: a drift monitor whose router holds ``--references`` training queries (static encoder, kNN, index
  auto): per report, the outlier scoring (the router's search) and the overlap bookkeeping, p50 / p99, and the
  process's peak memory.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
PRICE = {"input_per_mtok": 0.1, "output_per_mtok": 0.2}


def peak_mb() -> float:
    """This process's own peak resident set (VmHWM: reset at exec, unlike getrusage's ru_maxrss, which a child
    inherits from the process that started it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def job(a) -> dict:
    from proxray.evaljob import JobConfig, run_job

    out = Path(a.out or tempfile.mkdtemp(prefix="proxray-bench-job-"))
    models = [f"sim-model-{i:02d}" for i in range(a.models)]
    cfg = {"output": str(out), "sampling": {"max_tokens": 16},
           "query_sets": [{"synthetic": {"n_per_task": a.queries // 10, "seed": 11}}],
           "models": [{"id": m, "engine": "sim", "price": PRICE, "batch_size": 256, "num_cpus": 0.2,
                       "engine_kwargs": {"latency_s": 0.0, "generic": True}} for m in models]}
    (out / "job.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "job.json").write_text(json.dumps(cfg))
    t0 = time.time()
    result = run_job(JobConfig.model_validate(cfg), str(out))
    wall = time.time() - t0
    rows = result["rows"]
    cons = subprocess.run([sys.executable, __file__, "consolidate", "--out", str(out)], capture_output=True,
                          text=True, check=True)
    c = json.loads(cons.stdout.strip().splitlines()[-1])
    return {"part": "job", "queries": a.queries, "models": a.models, "rows": rows, "wall_s": round(wall, 1),
            "rows_per_s": round(rows / wall, 1), "rows_per_s_per_model": round(rows / wall / a.models, 1),
            "driver_peak_mb": round(peak_mb()), "consolidate_s": c["seconds"], "consolidate_peak_above_mb": c["peak_mb"],
            "consolidate_rss_before_mb": c["before_mb"], "table_bytes": (out / "routing_table.parquet").stat().st_size}


def consolidate_only(a) -> None:
    from proxray.common.storage import Store
    from proxray.evaljob import JobConfig
    from proxray.evaljob.consolidate import consolidate
    from proxray.evaljob.job import load_queries
    from proxray.evaljob.keys import expected_keys

    cfg = JobConfig.model_validate(json.loads((Path(a.out) / "job.json").read_text()))
    queries = load_queries(cfg)
    keys = expected_keys(cfg.models, queries, cfg.sampling, cfg.grader)
    import threading

    def rss_mb() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    before, top, done = rss_mb(), [0.0], threading.Event()

    def sample():  # the resident set every 20 ms: the consolidation's own peak above what was loaded before it
        while not done.is_set():
            top[0] = max(top[0], rss_mb())
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    t0 = time.time()
    consolidate(Store(a.out), keys)
    seconds = time.time() - t0
    done.set()
    print(json.dumps({"seconds": round(seconds, 1), "peak_mb": round(max(top[0], rss_mb()) - before),
                      "before_mb": round(before)}))


def big_table(n: int, m: int, path: Path) -> None:
    import numpy as np
    import pandas as pd

    from bench_scale import real_prompts

    base = real_prompts()
    rng = np.random.default_rng(0)
    prompts = [base[i % len(base)] + ("" if i < len(base) else f" (variant {i // len(base)})") for i in range(n)]
    tasks = [f"task-{i % 20:02d}" for i in range(n)]
    skill = rng.uniform(0.3, 0.9, size=(20, m))
    correct = (rng.uniform(size=(n, m)) < skill[np.arange(n) % 20]).astype(np.float32)
    cost = np.tile(np.geomspace(1e-6, 1e-4, m), (n, 1)) * rng.uniform(0.5, 1.5, size=(n, m))
    rep = lambda values: pd.Series(values, dtype=object).repeat(m).to_numpy()  # noqa: E731 (not fixed-width text)
    df = pd.DataFrame({"query_id": rep([f"q{i:07d}" for i in range(n)]), "task": rep(tasks), "prompt": rep(prompts),
                       "model": np.tile([f"model-{j:02d}" for j in range(m)], n),
                       "correct": correct.ravel(), "cost": cost.ravel()})
    df.to_parquet(path, index=False)


def fit(a) -> dict:
    tmp = Path(a.out or tempfile.mkdtemp(prefix="proxray-bench-fit-"))
    tmp.mkdir(parents=True, exist_ok=True)
    table = tmp / "table.parquet"
    t0 = time.time()
    big_table(a.queries, a.models, table)
    res = {"part": "fit", "queries": a.queries, "models": a.models, "rows": a.queries * a.models,
           "router": a.router, "table_write_s": round(time.time() - t0, 1), "table_bytes": table.stat().st_size}
    env = {**os.environ, "PROXRAY_CACHE": str(tmp / "cache")}
    for run in ("first", "again"):
        t0 = time.time()
        p = subprocess.run([sys.executable, "-c", FIT_CHILD, str(table), a.router, str(tmp / f"r-{run}")],
                           capture_output=True, text=True, env=env)
        if p.returncode:
            raise SystemExit(p.stderr[-3000:])
        child = json.loads(p.stdout.strip().splitlines()[-1])
        res[run] = {"wall_s": round(time.time() - t0, 1), **child}
    return res


FIT_CHILD = """
import json, sys, time
t0 = time.time()
from proxray.cli import main
import proxray.embeddings.encoder as enc
spent = {}
orig = enc.SentenceEncoder.encode
def timed(self, texts):
    t = time.time(); out = orig(self, texts); spent["encode_s"] = spent.get("encode_s", 0) + time.time() - t
    return out
enc.SentenceEncoder.encode = timed
rc = main(["fit", "--table", sys.argv[1], "--router", sys.argv[2], "--encoder", "static", "--out", sys.argv[3]])
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"rc": rc, "seconds": round(time.time() - t0, 1), "encode_s": round(spent.get("encode_s", 0), 1),
                  "peak_mb": round(hwm / 1024)}))
"""


def monitor(a) -> dict:
    import numpy as np

    from proxray import KNNRouter
    from proxray.data.table import RoutingTable
    from proxray.demos.drift import job_template
    from proxray.embeddings.encoder import SentenceEncoder
    from proxray.monitor import DriftMonitor

    tmp = Path(tempfile.mkdtemp(prefix="proxray-bench-monitor-"))
    big_table(a.references, 10, tmp / "t.parquet")
    table = RoutingTable.read(tmp / "t.parquet")
    enc = SentenceEncoder("static", progress=False, cache=str(tmp / "e.sqlite"))
    X = enc.encode(table.prompts)
    acc, cost = table.matrices()
    t0 = time.time()
    router = KNNRouter().fit(X, acc, cost, models=table.models, encoder_id=enc.id, query_ids=table.query_ids,
                             tasks=table.tasks)
    router.save(tmp / "r")
    fit_s = time.time() - t0
    t0 = time.time()
    mon = DriftMonitor({"router": str(tmp / "r"), "table": str(tmp / "t.parquet"), "state_dir": str(tmp / "s"),
                        "job": job_template(), "max_buffer": a.reports + 10, "window": 500, "shadow_rate": 0.0,
                        "submit": "inline"}, encoder=enc)
    start_s = time.time() - t0
    texts = [f"Write a haiku about the number {i} and a {w}." for i, w in
             zip(range(a.reports), ["river", "mountain", "compiler", "violin"] * a.reports)]
    Xq = enc.encode(texts)
    score, report = [], []
    for text, x in zip(texts, Xq):
        t0 = time.perf_counter()
        s = float(router.outlier_score(x[None])[0])  # what the ingress computes with the route
        score.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        mon.report(text, x, s)
        report.append(time.perf_counter() - t0)
    ms = lambda v: (round(float(np.median(v)) * 1e3, 3), round(float(np.quantile(v, 0.99)) * 1e3, 3))  # noqa: E731
    return {"part": "monitor", "references": a.references, "reports": a.reports, "router_fit_s": round(fit_s, 1),
            "monitor_start_s": round(start_s, 1), "outlier_score_ms_p50_p99": ms(score),
            "report_ms_p50_p99": ms(report), "peak_mb": round(peak_mb())}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=["job", "fit", "monitor", "consolidate"])
    p.add_argument("--queries", type=int, default=100_000)
    p.add_argument("--models", type=int, default=10)
    p.add_argument("--router", choices=["knn", "km"], default="knn")
    p.add_argument("--references", type=int, default=100_000)
    p.add_argument("--reports", type=int, default=2000)
    p.add_argument("--out", default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.part == "consolidate":
        return consolidate_only(a)
    res = {"job": job, "fit": fit, "monitor": monitor}[a.part](a)
    from report import emit

    emit(res, a.json)


if __name__ == "__main__":
    main()
