"""Where one request's time goes inside the ingress replica, stage by stage, in µs (not a timed test).

    python bench/profile_request.py [--requests 500] [--json out.json]

One ingress replica's ``Gateway`` and stages are built in this process (no Serve, no HTTP front: the replica's context
given, as ``tests/test_request_path.py`` does), its one model an ``engine: openai`` endpoint on a stand-in upstream on
127.0.0.1 that answers at once (``bench_relay_stall.standin``), relayed from here; a local Ray holds the app's shared
actors (keys ledger, answer book). Each request is a named chat completion sent through the ingress's own ``_handle``,
with a key that has no limit (``unrestricted``) or one with a budget (``budgeted``). Every stage's ``before`` and
``answered`` is timed, and so are the answer's making (``respond``) and the whole handler; the call stage's time is
the relay's hop, of which a direct call to the upstream with the same client (``upstream``) is the part outside the
gateway. Prints the medians and p95s and the handler's CPU time per request.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(__file__))
from bench_relay_stall import standin  # noqa: E402

APP = "profile-request"


def replica(tmp: str, upstream: str):
    from ray import serve

    from proxray import KNNRouter, SentenceEncoder
    from proxray.pool.simulated import make_table
    from proxray.serve.builder import app_args
    from proxray.serve.gateway import Gateway
    from proxray.serve.protocols import PROTOCOLS
    from proxray.serve.stages import path
    from proxray.serve.tenancy.keys import new_key_entry

    table = make_table(60)
    models = sorted(table.models)[:2]
    enc = SentenceEncoder("static")
    KNNRouter(k=10).fit(enc.encode(table.prompts), *table.matrices(models=models), models=models,
                        encoder_id=enc.id).save(f"{tmp}/router")
    keys = {"unrestricted": new_key_entry(f"{tmp}/keys.yaml", "open"),
            "budgeted": new_key_entry(f"{tmp}/keys.yaml", "team", budget={"usd": 1e6})}
    with open(f"{tmp}/upstream-key", "w") as f:
        f.write("sk-upstream\n")
    relayed = [{"id": m, "engine": "openai", "base_url": upstream, "api_key_file": f"{tmp}/upstream-key",
                "price": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}} for m in models]
    serve.get_replica_context = lambda: types.SimpleNamespace(app_name=APP,
                                                              replica_id=types.SimpleNamespace(unique_id="r1"))
    a = app_args({"router": f"{tmp}/router", "models": relayed, "encoder": "static", "keys_file": f"{tmp}/keys.yaml"})
    gw = Gateway(a.model_dump(), {m.id: {"relay": m.model_dump()} for m in a.models}, PROTOCOLS)
    return gw, path(gw), keys, models[0]


def request(body: bytes, token: str):
    from starlette.requests import Request

    sent = []

    async def receive():
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)

    headers = [(b"content-type", b"application/json"), (b"authorization", f"Bearer {token}".encode())]
    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers,
                    "query_string": b"", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "scheme": "http",
                    "root_path": "", "http_version": "1.1"}, receive)


def timed(stages, spent: dict):
    """Each stage's ``before`` and ``answered`` wrapped to add its µs to ``spent[name]`` (this request's)."""
    for stage in stages:
        name = type(stage).__name__
        before, answered = stage.before, stage.answered

        async def b(f, before=before, name=name):
            t = time.perf_counter()
            try:
                return await before(f)
            finally:
                spent[name] = spent.get(name, 0.0) + 1e6 * (time.perf_counter() - t)

        def a(f, answered=answered, name=name):
            t = time.perf_counter()
            try:
                return answered(f)
            finally:
                spent[name + ".answered"] = spent.get(name + ".answered", 0.0) + 1e6 * (time.perf_counter() - t)

        stage.before, stage.answered = b, a


async def measure(gw, stages, chat, token: str, model: str, n: int, upstream: str) -> dict:
    import httpx

    from proxray.common.quickack import async_transport
    from proxray.serve.stages import Flight, respond, run

    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "What is 17 * 23?"}],
                       "max_tokens": 8}).encode()
    spent: dict = {}
    timed(stages, spent)
    rows = []
    direct = httpx.AsyncClient(base_url=upstream, transport=async_transport())
    for i in range(n + 50):  # the first 50 warm up
        spent.clear()
        cpu, t0 = time.process_time(), time.perf_counter()
        f = Flight(request(body, token), chat, gw.args.timeout_s)
        counts = await run(stages, f)
        t1 = time.perf_counter()
        response = await respond(f, counts, gw)
        t2 = time.perf_counter()
        row = {**spent, "respond": 1e6 * (t2 - t1), "handler": 1e6 * (t2 - t0),
               "handler_cpu": 1e6 * (time.process_time() - cpu)}
        assert response.status_code == 200, response.body
        t = time.perf_counter()
        await direct.post("/chat/completions", content=body)
        row["upstream"] = 1e6 * (time.perf_counter() - t)
        if i >= 50:
            rows.append(row)
        await asyncio.sleep(0)  # the batches and the answer book's writes run between requests, as they do in Serve
    await direct.aclose()
    keys = list(rows[0])
    out = {k: {"p50_us": round(statistics.median(r.get(k, 0.0) for r in rows), 1),
               "p95_us": round(sorted(r.get(k, 0.0) for r in rows)[int(0.95 * (len(rows) - 1))], 1)} for k in keys}
    return out


def main(argv=None):
    import ray

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    upstream = f"http://127.0.0.1:{standin(nodelay=True)}/v1"
    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        tmp = tempfile.mkdtemp()
        gw, stages, keys, model = replica(tmp, upstream)
        from proxray.serve.protocols import PROTOCOLS

        chat = next(p for p in PROTOCOLS.values() if p.name == "chat")

        async def both():
            return {kind: await measure(gw, stages if kind == "unrestricted" else _fresh(gw), chat, keys[kind], model,
                                        a.requests, upstream) for kind in ("unrestricted", "budgeted")}

        res = asyncio.run(both())
    finally:
        ray.shutdown()
    print(f"| stage (µs, {a.requests} requests, one at a time) | unrestricted p50 | p95 | budgeted p50 | p95 |")
    print("|---|---|---|---|---|")
    for k in res["unrestricted"]:
        u, b = res["unrestricted"][k], res["budgeted"].get(k, {"p50_us": 0.0, "p95_us": 0.0})
        print(f"| {k} | {u['p50_us']} | {u['p95_us']} | {b['p50_us']} | {b['p95_us']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"requests": a.requests, "cpus": os.cpu_count(), **res}, f, indent=1)


def _fresh(gw):
    from proxray.serve.stages import path

    return path(gw)


if __name__ == "__main__":
    main()
