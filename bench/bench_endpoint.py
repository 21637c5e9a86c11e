"""What the hop to an endpoint proxray does not host costs, and the job's pace against a rate limit (not a timed test).

    python bench/bench_endpoint.py [--requests 200] [--concurrency 1,8] [--rpm 300] [--job-queries 100]

Serves a stand-in OpenAI-compatible API on 127.0.0.1 (tests/openai_standin.py, no faults) as the pool model
`frontier` (engine openai) beside a simulated one, and at each concurrency sends the same chat completion to the
endpoint directly and through the app by name (pass-through) and routed: p50 / p99 latency, and for streams the
time to the first content chunk; first, Ray Serve's own floor (an empty route, GET /health, through its proxy). Then runs the evaluation job on `--job-queries` queries against the endpoint at
`--rpm` requests a minute over two workers and reports requests a minute reached and the most in any minute.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def timed(url, body, headers, n, concurrency, stream):
    import httpx

    client = httpx.Client(timeout=30, headers=headers)

    def one(i):
        t0 = time.perf_counter()
        if not stream:
            r = client.post(url, json=body(i))
            return time.perf_counter() - t0, r.status_code == 200
        with client.stream("POST", url, json={**body(i), "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and '"content"' in line:
                    return time.perf_counter() - t0, r.status_code == 200
        return time.perf_counter() - t0, False

    with ThreadPoolExecutor(concurrency) as pool:
        res = list(pool.map(one, range(n)))
    lat = sorted(r[0] for r in res)
    return {"p50_ms": round(1e3 * statistics.median(lat), 2), "p99_ms": round(1e3 * lat[int(0.99 * (len(lat) - 1))], 2),
            "errors": sum(not r[1] for r in res)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--rpm", type=float, default=300.0)
    p.add_argument("--job-queries", type=int, default=100)
    a = p.parse_args(argv)
    import ray
    from openai_standin import MODEL, StandIn
    from serve_helpers import start_app, stop_app

    from proxray import SentenceEncoder

    tmp = Path(tempfile.mkdtemp())
    key = "sk-bench"
    (tmp / "key").write_text(key)
    (tmp / "key").chmod(0o600)
    standin = StandIn(key, faults=False)
    external = {"id": "frontier", "engine": "openai", "source": MODEL, "base_url": standin.url,
                "api_key_file": str(tmp / "key"), "price": {"input_per_mtok": 2.0, "output_per_mtok": 8.0}}
    url = start_app(tmp, SentenceEncoder("static"), [external, {"id": "meta-llama/Llama-3.2-1B-Instruct", "engine": "sim"}],
                    profile={"frontier": (0.95, 1e-7)}, encoder="static")
    body = (lambda model: lambda i: {"model": model, "max_tokens": 16,
                                     "messages": [{"role": "user", "content": f"What is {i} times 7?"}]})
    rows = []
    import httpx

    floor = []  # Serve's own floor on this machine: an empty route (GET /health) through its proxy to the router
    with httpx.Client(timeout=30) as client:
        for i in range(a.requests):
            t0 = time.perf_counter()
            client.get(f"{url}/health")
            floor.append(1e3 * (time.perf_counter() - t0))
    print(json.dumps({"serve_floor_health_p50_ms": round(statistics.median(floor[a.requests // 10:]), 2)}), flush=True)
    for c in [int(x) for x in a.concurrency.split(",")]:
        for stream in (False, True):
            direct = timed(f"{standin.url}/chat/completions", body(MODEL), {"Authorization": f"Bearer {key}"},
                           a.requests, c, stream)
            by_name = timed(f"{url}/v1/chat/completions", body("frontier"), {}, a.requests, c, stream)
            routed = timed(f"{url}/v1/chat/completions", body("proxray"), {}, a.requests, c, stream)
            rows.append({"concurrency": c, "stream": stream, "direct": direct, "pass_through": by_name,
                         "routed": routed, "hop_p50_ms": round(by_name["p50_ms"] - direct["p50_ms"], 2)})
            print(json.dumps(rows[-1]), flush=True)
    stop_app()

    from proxray.evaljob import JobConfig, run_job

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    before = len(standin.log)
    cfg = JobConfig.model_validate({
        "query_sets": [{"synthetic": {"n_per_task": max(1, a.job_queries // 10), "seed": 3}}],
        "sampling": {"max_tokens": 8},
        "models": [{**external, "replicas": 2, "batch_size": 10, "num_cpus": 0.5,
                    "rate_limit": {"requests_per_minute": a.rpm}}]})
    t0 = time.time()
    run_job(cfg, tmp / "table")
    wall = time.time() - t0
    times = sorted(t for t, _, _ in standin.log[before:])
    most = max(sum(1 for u in times if t <= u < t + 60.0) for t in times)
    span = (times[-1] - times[0]) or 1e-9
    print(json.dumps({"job_requests": len(times), "limit_rpm": a.rpm, "reached_rpm": round(60 * (len(times) - 1) / span, 1),
                      "most_in_any_minute": most, "job_wall_s": round(wall, 1)}), flush=True)
    ray.shutdown()
    standin.stop()


if __name__ == "__main__":
    main()
