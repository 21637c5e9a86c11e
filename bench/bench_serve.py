"""Bounded load on the routed endpoint at 127.0.0.1 (not a timed test).

    python bench/bench_serve.py [--encoder static] [--requests 400] [--concurrency 1,8] [--backend onnx] [--trace]

Starts the cpu_demo application (four simulated models, kNN router over ``--encoder``'s embeddings: the
shipped MiniLM by default, ``static`` for the static encoder distilled from it) on a local Ray Serve, and at
each ``--concurrency`` sends ``--requests`` chat completions with that many client threads in three modes,
interleaved over two rounds: routed with every prompt new (``routed, new text``: the encoder runs for
each request), routed over the demo's 40 prompts again and again (``routed, repeated text``: the
embedding LRU answers), and passed through (``model: <pool model>``). Prints throughput, p50/p99 latency
and errors, the ratio of routed to pass-through p50, where a routed request's time goes (the
``proxray.timings`` the ingress reports, medians), and the encoder's throughput on one core (texts a second,
one text per call and batches of 64, over the same never-seen texts). ``--trace``: the ingress exports OpenTelemetry
spans (``OTEL_EXPORTER_OTLP_ENDPOINT``) to a collector stand-in on 127.0.0.1 that takes every batch and keeps
nothing; the spans it took are printed.
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


def load(url, body, n, concurrency, headers=None):
    import httpx

    client = httpx.Client(timeout=30, headers=headers)

    def one(i):
        t0 = time.perf_counter()
        try:
            r = client.post(url, content=json.dumps(body(i)), headers={"content-type": "application/json"})
            ok = r.status_code == 200
            report = r.json().get("proxray", {}) if ok else {}
        except httpx.HTTPError:
            ok, report = False, {}
        elapsed = time.perf_counter() - t0
        if report:
            report["timings"]["outside_ms"] = 1e3 * (elapsed - report["latency_s"])  # HTTP, proxy, client
        return elapsed, ok, report.get("timings", {})

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        res = list(pool.map(one, range(n)))
    wall = time.perf_counter() - t0
    lat = sorted(r[0] for r in res)
    return {"requests": n, "errors": sum(not r[1] for r in res), "rps": n / wall,
            "p50_ms": 1e3 * statistics.median(lat), "p99_ms": 1e3 * lat[int(0.99 * (len(lat) - 1))],
            "timings": [r[2] for r in res if r[2]]}


def breakdown(timings: list) -> str:
    keys = ["read_ms", "parse_ms", "embed_ms", "estimate_ms", "model_ms", "outside_ms"]
    med = {k: statistics.median(t.get(k, 0.0) for t in timings) for k in keys}
    hits = sum(t.get("embedding_cache") == "hit" for t in timings)
    batch = [t["encoder_batch"] for t in timings if "encoder_batch" in t]
    passes = (f"encoder batch mean {statistics.mean(batch):.1f}" if any(batch) else "encoded inline") if batch else ""
    return (" | ".join(f"{k[:-3]} {v:.2f}" for k, v in med.items())
            + f" | cache hits {hits}/{len(timings)}"
            + (f" | {passes}, encode {statistics.median(t['encode_ms'] for t in timings if 'encode_ms' in t):.2f} ms"
               if batch else ""))


def start_demo_app(extra_models=(), engine_kwargs=None, variants=None, **app_args):
    """The cpu_demo app on a local Serve at a free 127.0.0.1 port (``extra_models``: pool models beside its four
    simulated ones; ``engine_kwargs``: {model: its simulated engine's kwargs}; ``env``: its workers' environment;
    ``variants``: {name: app args} — beside it, the same app with those args otherwise, served at ``/<name>``):
    (chat URL, prompts, stop())."""
    import ray
    from ray import serve

    from proxray import KNNRouter, SentenceEncoder
    from proxray.serve.app import build_app
    from proxray.data.synthetic import generate_queries
    from proxray.pool.simulated import make_table

    tmp = tempfile.mkdtemp()
    table = make_table(100)
    enc = SentenceEncoder(app_args.get("encoder"))
    KNNRouter(k=50).fit(enc.encode(table.prompts), *table.matrices(models=MODELS), models=MODELS,
                        encoder_id=enc.id).save(f"{tmp}/router")
    prompts = list(generate_queries(4, seed=9).prompt)  # 4 per task: 40 prompts
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = app_args.pop("env", {})
    ray.init(include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env} if env else None)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    auto = {"min_replicas": 1, "max_replicas": 1}
    args = {"router": f"{tmp}/router", **app_args,
            "models": [{"id": m, "engine": "sim", "autoscaling": auto, "engine_kwargs": (engine_kwargs or {}).get(m, {})}
                       for m in MODELS] + list(extra_models)}
    serve.run(build_app(args), name="proxray", route_prefix="/")
    for name, update in (variants or {}).items():
        serve.run(build_app({**args, **update}), name=name, route_prefix=f"/{name}")
    return f"http://127.0.0.1:{port}/v1/chat/completions", prompts, lambda: (serve.shutdown(), ray.shutdown())


def collector() -> tuple:
    """An OTLP/HTTP sink on 127.0.0.1: (its URL, a function giving the bytes of spans it took)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    took = [0]

    class Sink(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            took[0] += len(self.rfile.read(int(self.headers.get("content-length") or 0)))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", lambda: took[0]


def encode_throughput(encoder: str | None, backend: str, texts: list) -> dict:
    """Texts a second on one core (one text per call, and batches of 64), the encoder of the app alone."""
    from proxray.embeddings.encoder import SentenceEncoder

    enc = SentenceEncoder(encoder, cache=False, progress=False, backend=backend, threads=1)
    enc.encode(texts[:8])  # load
    t0 = time.perf_counter()
    for t in texts:
        enc.encode([t])
    one = len(texts) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for s in range(0, len(texts), 64):
        enc.encode(texts[s:s + 64])
    return {"one_per_call": one, "batch_64": len(texts) / (time.perf_counter() - t0)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--encoder", default=None, help="static, or a sentence-transformers name or path (default MiniLM)")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", default="1,8", help="comma-separated client thread counts")
    p.add_argument("--backend", default="onnx", choices=["torch", "onnx", "onnx-int8"])
    p.add_argument("--cache-entries", type=int, default=10000)
    p.add_argument("--batch-wait-s", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=None, help="the encoder's threads (default min(2, CPUs))")
    p.add_argument("--trace", action="store_true", help="the ingress exports its spans to a local collector stand-in")
    a = p.parse_args(argv)
    from proxray.data.synthetic import generate_queries

    levels = [int(c) for c in a.concurrency.split(",")]
    sink, took = collector() if a.trace else (None, lambda: 0)
    url, prompts, stop = start_demo_app(encoder=a.encoder, encoder_backend=a.backend,
                                        embedding_cache_entries=a.cache_entries, embed_batch_wait_s=a.batch_wait_s,
                                        encoder_threads=a.threads,
                                        env={"OTEL_EXPORTER_OTLP_ENDPOINT": sink} if sink else {})
    sent = set(prompts)
    fresh = iter(dict.fromkeys(p for s in range(1000, 1400) for p in generate_queries(40, seed=s).prompt
                               if p not in sent))  # never sent before: every one a cache miss
    new_text = lambda i: next(fresh)  # noqa: E731
    msg = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    load(url, lambda i: {"model": "proxray", "messages": msg(prompts[i % len(prompts)])}, 40, max(levels))  # warm-up
    modes = {
        "routed, new text": lambda i: {"model": "proxray", "messages": msg(new_text(i))},
        "routed, repeated text": lambda i: {"model": "proxray", "messages": msg(prompts[i % len(prompts)])},
        "pass-through": lambda i: {"model": MODELS[i % 4], "messages": msg(prompts[i % len(prompts)])},
    }
    name = a.encoder or "MiniLM"
    for conc in levels:
        rows = {}
        for _ in range(2):  # alternate, so drift hits all alike
            for mode, body in modes.items():
                rows.setdefault(mode, []).append(load(url, body, a.requests, conc))
        print(f"\n| mode | requests | errors | req/s | p50 ms | p99 ms |  (concurrency {conc}, {os.cpu_count()} CPUs, "
              f"encoder {name}, backend {a.backend})")
        print("|---|---|---|---|---|---|")
        best = {}
        for mode, runs in rows.items():
            r = min(runs, key=lambda x: x["p50_ms"])
            best[mode] = r
            print(f"| {mode} | {sum(x['requests'] for x in runs)} | {sum(x['errors'] for x in runs)} | {r['rps']:.1f} | "
                  f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
        base = best["pass-through"]["p50_ms"]
        for mode in ("routed, new text", "routed, repeated text"):
            print(f"{mode}: routed / pass-through p50 {best[mode]['p50_ms'] / base:.2f} (concurrency {conc}); "
                  f"medians ms: {breakdown(sum((r['timings'] for r in rows[mode]), []))}")
        print(f"pass-through medians ms: {breakdown(sum((r['timings'] for r in rows['pass-through']), []))}")
    stop()
    if a.trace:
        print(f"\ntraces: the collector took {took() / 1e6:.2f} MB of spans")
    texts = [p for s in range(2000, 2050) for p in generate_queries(40, seed=s).prompt][:2000]
    tp = encode_throughput(a.encoder, a.backend, texts)
    print(f"\nencoder {name} on one core: {tp['one_per_call']:,.0f} texts/s one per call, "
          f"{tp['batch_64']:,.0f} texts/s in batches of 64 ({len(texts)} texts)")


if __name__ == "__main__":
    main()
