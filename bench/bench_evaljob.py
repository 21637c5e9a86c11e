"""Evaluation-job throughput per engine on this machine (not a timed test).

    python bench/bench_evaljob.py [--queries 400]
    python bench/bench_evaljob.py --fanout [--queries 60] [--latency 1.0]

Runs the job on synthetic queries with one model per engine (sim; transformers with the tiny model
that ``proxray make-tiny-model`` builds) and prints rows per second end to end (Ray Data start,
inference, grading, pricing and the per-batch parquet writes included) and of the engine alone.
The vLLM engine against vLLM's own offline throughput on the same prompts: ``bench/bench_vllm.py job``.

``--fanout``: wall time of a job with one slow sim model (``latency`` seconds per batch of 5) against the
same job with three; the pool runs at once, so the ratio approaches 1 (one model after another: ~3).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queries", type=int, default=400)
    p.add_argument("--fanout", action="store_true", help="1 slow model vs 3 at once")
    p.add_argument("--latency", type=float, default=1.0, help="--fanout: seconds per batch")
    a = p.parse_args(argv)
    import ray

    from proxray.devtools import build_tiny_model

    from proxray.pool.simulated import SimEngine

    from proxray.pool.spec import Sampling

    from proxray.pool.transformers_engine import TransformersEngine
    from proxray.evaljob import JobConfig, run_job
    from proxray.data.querysets import synthetic_queries

    per_task = max(1, a.queries // 10)
    tmp = tempfile.mkdtemp()
    if a.fanout:
        return fanout(per_task, a.latency, tmp)
    tiny = build_tiny_model(os.path.join(tmp, "tiny"))
    rows = synthetic_queries(per_task, seed=11).to_dict("records")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    print("| engine | rows | job rows/s (end to end) | engine alone rows/s |\n|---|---|---|---|")
    for engine, source, kw, alone in (
            ("sim", None, {}, lambda: SimEngine("google/gemma-7b-it")),
            ("transformers", tiny, {"batch_size": 16}, lambda: TransformersEngine(tiny, batch_size=16))):
        model = {"id": "google/gemma-7b-it" if engine == "sim" else "tiny", "source": source, "engine": engine,
                 "price": {"input_per_mtok": 0.03, "output_per_mtok": 0.05}, "batch_size": 32, "replicas": 2, "num_cpus": 1,
                 "engine_kwargs": kw}
        cfg = JobConfig.model_validate({"output": "x", "sampling": {"max_tokens": 16},
                                        "query_sets": [{"synthetic": {"n_per_task": per_task, "seed": 11}}],
                                        "models": [model]})
        t0 = time.time()
        run_job(cfg, os.path.join(tmp, f"out-{engine}"))
        job = len(rows) / (time.time() - t0)
        eng = alone()
        t0 = time.time()
        for s in range(0, len(rows), 32):
            eng.generate(rows[s:s + 32], Sampling(max_tokens=16))
        print(f"| {engine} | {len(rows)} | {job:.1f} | {len(rows) / (time.time() - t0):.1f} |", flush=True)


def fanout(per_task: int, latency: float, tmp: str) -> None:
    import ray

    from proxray.evaljob import JobConfig, run_job

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ids = ["meta-llama/Llama-3.2-1B-Instruct", "microsoft/Phi-3-small-8k-instruct", "meta-llama/Llama-3.3-70B-Instruct"]

    def job(models, name):
        cfg = JobConfig.model_validate({
            "output": "x", "sampling": {"max_tokens": 16},
            "query_sets": [{"synthetic": {"n_per_task": per_task, "seed": 11}}],
            "models": [{"id": m, "engine": "sim", "price": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}, "batch_size": 5, "num_cpus": 0.25,
                        "engine_kwargs": {"latency_s": latency}} for m in models]})
        t0 = time.time()
        run_job(cfg, os.path.join(tmp, name))
        return time.time() - t0

    job(ids[:1], "warm")  # worker processes up
    one, three = job(ids[:1], "one"), job(ids, "three")
    print(f"| models | queries | seconds |\n|---|---|---|\n| 1 | {per_task * 10} | {one:.1f} |\n"
          f"| 3 | {per_task * 10} | {three:.1f} |\n\n3 models / 1 model: {three / one:.2f}")


if __name__ == "__main__":
    main()
