"""Evaluation-job throughput per engine on this machine (not a timed test).

    python bench/bench_evaljob.py [--queries 400]

Runs the job on synthetic queries with one model per engine (sim; transformers with the tiny model
that ``proxray make-tiny-model`` builds) and prints rows per second end to end (Ray Data start,
inference, grading, pricing and the per-batch parquet writes included) and of the engine alone.
The vLLM engine against vLLM's own offline throughput on the same prompts: ``bench/bench_vllm.py job``.
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
    a = p.parse_args(argv)
    import ray

    from proxray.engines import Sampling, SimEngine, TransformersEngine, build_tiny_model
    from proxray.evaljob import JobConfig, run_job
    from proxray.querysets import synthetic_queries

    per_task = max(1, a.queries // 10)
    tmp = tempfile.mkdtemp()
    tiny = build_tiny_model(os.path.join(tmp, "tiny"))
    rows = synthetic_queries(per_task, seed=11).to_dict("records")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    print("| engine | rows | job rows/s (end to end) | engine alone rows/s |\n|---|---|---|---|")
    for engine, source, kw, alone in (
            ("sim", None, {}, lambda: SimEngine("google/gemma-7b-it")),
            ("transformers", tiny, {"batch_size": 16}, lambda: TransformersEngine(tiny, batch_size=16))):
        model = {"id": "google/gemma-7b-it" if engine == "sim" else "tiny", "source": source, "engine": engine,
                 "price_in": 0.03, "price_out": 0.05, "batch_size": 32, "replicas": 2, "num_cpus": 1,
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


if __name__ == "__main__":
    main()
