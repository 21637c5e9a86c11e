"""End-to-end drift scenario on CPU: ``proxray demo drift`` (or ``python bench/drift_demo.py``).

1. Fit a kNN router on the synthetic table *without* task T (default gsm8k, whose best models differ
   most from the other tasks') and serve it (Ray Serve, simulated pool) with a drift monitor actor.
2. Send T's queries to the endpoint at 127.0.0.1. The router deployment reports each one to the
   monitor; the monitor finds them drifted, buffers them, and submits the evaluation job (sim engine,
   every pool model) through the Ray Jobs API.
3. When the job has finished, the monitor adds the labeled queries to the router and the router
   deployment switches to the new artifact while serving.
4. Measure routing on T's held-out queries (never sent) with the first and the final router.

The last line printed is JSON: {"task", "before", "after", "evaluations", ...} (AUC % on T).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .logs import log as _log

POOL = ["meta-llama/Llama-3.2-1B-Instruct", "google/gemma-7b-it", "deepseek-ai/deepseek-math-7b-instruct",
        "microsoft/Phi-3-small-8k-instruct", "meta-llama/Llama-3.3-70B-Instruct"]
PRICES = {m: v for m, v in __import__("proxray.synthetic", fromlist=["MODELS"]).MODELS.items()}


def log(msg):
    _log(msg, "drift-demo")


def auc_on(router, X, acc, cost):
    from .metrics import routing_score

    a, c = router.estimate(X)
    return routing_score(a, c, acc, cost)


class Labeler:
    """Looks up the reference answers of synthetic queries by prompt (in production: a grader or
    human labels). Picklable, so the monitor actor can hold it."""

    def __init__(self, queries):
        self.by_prompt = {r["prompt"]: r for r in queries.to_dict("records")}

    def __call__(self, records):
        import pandas as pd

        rows = [self.by_prompt[r["prompt"]] for r in records if r["prompt"] in self.by_prompt]
        return pd.DataFrame(rows).drop_duplicates("query_id")


def run(task="gsm8k", n_per_task=60, min_batch=20, send=None, state_dir=None, timeout_s=240):
    import httpx
    import ray
    from ray import serve

    from .embed import SentenceEncoder
    from .routers import KNNRouter
    from .serve.app import build_app
    from .monitor import start_monitor
    from .synthetic import generate_queries, make_table

    state = Path(state_dir or tempfile.mkdtemp(prefix="proxray-drift-"))
    full = make_table(n_per_task)
    queries = generate_queries(n_per_task)
    enc = SentenceEncoder(progress=False)
    X = enc.encode(full.prompts)
    acc, cost = full.matrices(models=POOL)
    is_t = full.tasks == task
    rng = np.random.default_rng(0)
    t_idx = rng.permutation(np.flatnonzero(is_t))
    t_live, t_test = t_idx[: len(t_idx) // 2], t_idx[len(t_idx) // 2:]
    train = np.flatnonzero(~is_t)
    full.subset([full.query_ids[i] for i in train]).write(state / "train_table.parquet")
    router0 = KNNRouter(k=50, inv_tau=20.0).fit(X[train], acc[train], cost[train], models=POOL, encoder_id=enc.id)
    router0.save(state / "router_v0")
    before = auc_on(router0, X[t_test], acc[t_test], cost[t_test])
    log(f"router v0 fitted without {task}: AUC on held-out {task} queries = {before:.2f}%")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = ray.init(include_dashboard=True, log_to_driver=False, num_cpus=max(4, os.cpu_count() or 1))
    jobs_address = f"http://{ctx.dashboard_url}"  # the Ray Jobs API is served by the dashboard
    job_config = {"sampling": {"max_tokens": 64},
                  "models": [{"id": m, "engine": "sim", "price_in": PRICES[m][1], "price_out": PRICES[m][2],
                              "num_cpus": 0.25, "batch_size": 16} for m in POOL]}
    monitor = start_monitor(router_path=str(state / "router_v0"), table_path=str(state / "train_table.parquet"),
                            state_dir=str(state / "monitor"), z=3, window=100, min_batch=min_batch,
                            max_evals_per_hour=4, cost_budget=1.0, job_config=job_config,
                            labeler=Labeler(queries), submit="jobs_api", jobs_address=jobs_address)
    ray.get(monitor.status.remote())
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    auto = {"min_replicas": 1, "max_replicas": 1}
    serve.run(build_app({"router": str(state / "router_v0"), "monitor": "proxray-monitor", "reload_every_s": 1.0,
                         "models": [{"id": m, "engine": "sim", "autoscaling": auto} for m in POOL]}),
              name="proxray", route_prefix="/")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    live = [full.prompts[i] for i in t_live][: send or len(t_live)]
    inliers = [full.prompts[i] for i in rng.choice(train, 20, replace=False)]
    log(f"sending {len(inliers)} inlier and {len(live)} {task} queries to {url}")
    with httpx.Client(timeout=30) as client:
        for p in inliers + live:
            r = client.post(url, json={"model": "proxray", "messages": [{"role": "user", "content": p}]})
            r.raise_for_status()
    deadline = time.time() + timeout_s
    final_path = None
    while time.time() < deadline:
        ray.get(monitor.maybe_evaluate.remote())
        new = ray.get(monitor.poll.remote())
        status = ray.get(monitor.status.remote())
        if new:
            final_path = new
            log(f"monitor absorbed the evaluation: {new}")
            break
        log(f"monitor: {status['drifted']} drifted of {status['reported']}, buffer {status['buffer']}, "
            f"overlap {status['overlap']}, jobs {[j['status'] for j in status['jobs']]}")
        time.sleep(2)
    # the served router must switch without a restart
    served = None
    for _ in range(20):
        with httpx.Client(timeout=30) as client:
            served = client.post(url, json={"model": "proxray", "messages": [{"role": "user", "content": live[0]}]}).json()
        if served["proxray"]["router_path"] == final_path:
            break
        time.sleep(1)
    status = ray.get(monitor.status.remote())
    from .artifact import load_router

    after = auc_on(load_router(final_path), X[t_test], acc[t_test], cost[t_test]) if final_path else before
    result = {"task": task, "before": round(before, 2), "after": round(after, 2), "evaluations": status["evaluations"],
              "drifted": status["drifted"], "reported": status["reported"], "outlier_threshold": status["outlier_threshold"],
              "served_router_switched": bool(final_path and served["proxray"]["router_path"] == final_path)}
    serve.shutdown()
    ray.kill(monitor)
    ray.shutdown()
    return result


def main(argv=None):
    p = argparse.ArgumentParser(prog="proxray demo drift", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="gsm8k")
    p.add_argument("--n-per-task", type=int, default=60)
    p.add_argument("--min-batch", type=int, default=20)
    a = p.parse_args(argv)
    print(json.dumps(run(a.task, a.n_per_task, a.min_batch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
