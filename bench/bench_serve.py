"""Bounded load on the routed endpoint at 127.0.0.1 (not a timed test).

    python bench/bench_serve.py [--requests 400] [--concurrency 8]

Starts the cpu_demo application (four simulated models, kNN router over MiniLM embeddings) on a local
Ray Serve, sends ``--requests`` chat completions with ``--concurrency`` client threads, once routed
(``model: proxray``) and once passed through (``model: <pool model>``, the same app without the
encoder and router), and prints throughput, p50/p99 latency and errors of both, and the ratio of
routed to pass-through latency (the router's overhead; target <= 1.3).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
MODELS = ["meta-llama/Llama-3.2-1B-Instruct", "google/gemma-7b-it", "microsoft/Phi-3-small-8k-instruct",
          "meta-llama/Llama-3.3-70B-Instruct"]


def load(url, body, n, concurrency):
    import httpx

    client = httpx.Client(timeout=30)

    def one(i):
        t0 = time.perf_counter()
        try:
            r = client.post(url, content=json.dumps(body(i)), headers={"content-type": "application/json"})
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        return time.perf_counter() - t0, ok

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        res = list(pool.map(one, range(n)))
    wall = time.perf_counter() - t0
    lat = sorted(r[0] for r in res)
    return {"requests": n, "errors": sum(not r[1] for r in res), "rps": n / wall,
            "p50_ms": 1e3 * statistics.median(lat), "p99_ms": 1e3 * lat[int(0.99 * (len(lat) - 1))]}


def start_demo_app():
    """The cpu_demo app on a local Serve at a free 127.0.0.1 port: (chat URL, prompts, stop())."""
    import ray
    from ray import serve

    from proxray import KNNRouter, SentenceEncoder
    from proxray.serve.app import build_app
    from proxray.synthetic import generate_queries, make_table

    tmp = tempfile.mkdtemp()
    table = make_table(100)
    enc = SentenceEncoder()
    KNNRouter(k=50).fit(enc.encode(table.prompts), *table.matrices(models=MODELS), models=MODELS,
                        encoder_id=enc.id).save(f"{tmp}/router")
    prompts = list(generate_queries(40, seed=9).prompt)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    auto = {"min_replicas": 1, "max_replicas": 1}
    serve.run(build_app({"router": f"{tmp}/router", "models": [{"id": m, "engine": "sim", "autoscaling": auto} for m in MODELS]}),
              name="proxray", route_prefix="/")
    return f"http://127.0.0.1:{port}/v1/chat/completions", prompts, lambda: (serve.shutdown(), ray.shutdown())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=8)
    a = p.parse_args(argv)
    url, prompts, stop = start_demo_app()
    msg = lambda i: [{"role": "user", "content": prompts[i % len(prompts)]}]  # noqa: E731
    load(url, lambda i: {"model": "proxray", "messages": msg(i)}, 40, a.concurrency)  # warm-up
    import httpx

    route_ms = [httpx.post(url, json={"model": "proxray", "messages": msg(i)}, timeout=30).json()["proxray"]["route_ms"]
                for i in range(30)]
    rows = {}
    for _ in range(2):  # alternate, so drift hits both alike
        rows.setdefault("routed", []).append(load(url, lambda i: {"model": "proxray", "messages": msg(i)}, a.requests, a.concurrency))
        rows.setdefault("pass-through", []).append(
            load(url, lambda i: {"model": MODELS[i % 4], "messages": msg(i)}, a.requests, a.concurrency))
    print(f"| mode | requests | errors | req/s | p50 ms | p99 ms |  (concurrency {a.concurrency}, {os.cpu_count()} CPUs)")
    print("|---|---|---|---|---|---|")
    best = {}
    for mode, runs in rows.items():
        r = min(runs, key=lambda x: x["p50_ms"])
        best[mode] = r
        print(f"| {mode} | {sum(x['requests'] for x in runs)} | {sum(x['errors'] for x in runs)} | {r['rps']:.1f} | "
              f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    print(f"routed / pass-through p50 latency: {best['routed']['p50_ms'] / best['pass-through']['p50_ms']:.2f}; "
          f"throughput ratio: {best['pass-through']['rps'] / best['routed']['rps']:.2f}")
    print(f"routing inside the ingress (encode + estimate), sequential: median {statistics.median(route_ms):.1f} ms")
    stop()


if __name__ == "__main__":
    main()
