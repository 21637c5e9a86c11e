"""The gateway's own cost beside LiteLLM's, on one stand-in upstream in one run (not a timed test).

    python bench/bench_gateways.py --litellm /path/to/venv/bin/litellm [--requests 300] [--concurrency 1,8]
        [--nagle] [--rounds 3] [--front haproxy|proxy] [--json out.json]
    python bench/bench_gateways.py --summarize research/benchmarks/gateways/*.json

One stand-in OpenAI upstream on 127.0.0.1 answers chat completions at once (``bench_relay_stall.standin``: headers
and body in two writes, ``--nagle`` with Nagle's algorithm on, else ``TCP_NODELAY`` as uvicorn and hosted APIs).
Three ways to it, requests interleaved round by round at each concurrency:

* **direct**: the client calls the upstream;
* **LiteLLM**: its proxy (``litellm --config``, one worker, a master key), the upstream as an ``openai/`` model;
* **proxray, named**: the CPU demo app with a keys file, the upstream an ``engine: openai`` pool member the request
  names, sent with a key that has no rate or budget (a pure pass-through: key, policy, its charge, the relay);
* **proxray, budgeted**: the same with a key that has a budget (admitted, held and settled on its replica's lease).

Then a **saturation** phase (``--saturate``, default 32 clients for ``--saturate-s`` seconds each): requests a second
through direct, LiteLLM, Serve's empty app (the ceiling of Serve's front and this client on the machine) and both
proxray keys.

Also measured, to say where the time goes: **Serve, empty app** (an application beside proxray's on the same Serve
that reads the body and answers a fixed completion: what Serve's front costs by itself), **Serve, empty FastAPI app**
(the same answer from a FastAPI route under ``@serve.ingress``, as proxray's ingress is), **proxray, co-hosted** (a
simulated model the request names: the model deployment's handle on the path) and **proxray, routed**
(``model: proxray``: the encoder and the router too). ``--front`` picks how HTTP reaches the replicas: Serve's
HAProxy ingress (the default proxray's clusters run, ``proxray.serve.front``) or Serve's Python proxy. The client is
httpx on ``proxray.common.quickack`` (so the client itself never meets the delayed-ACK stall), one connection pool per
target. LiteLLM: ``pip install 'litellm[proxy]==1.108.7'``
in an environment of its own (its pins conflict with the dev lock). Prints p50 / p95 / p99 and each gateway's added
latency over direct, with the hardware.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(__file__))
from bench_relay_stall import standin  # noqa: E402

MASTER = "sk-bench-master-not-a-secret"
SIM = "meta-llama/Llama-3.2-1B-Instruct"


def litellm_proxy(binary: str, upstream: str) -> tuple[str, subprocess.Popen]:
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tempfile.mkdtemp()
    cfg = {"model_list": [{"model_name": "standin", "litellm_params": {"model": "openai/standin", "api_base": upstream,
                                                                      "api_key": "sk-upstream"}}],
           "general_settings": {"master_key": MASTER}, "litellm_settings": {"telemetry": False}}
    path = os.path.join(folder, "config.yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)  # YAML reads JSON
    log = open(os.path.join(folder, "litellm.log"), "w")
    proc = subprocess.Popen([binary, "--config", path, "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "LITELLM_TELEMETRY": "False"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/health/liveliness", timeout=2).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError(f"LiteLLM's proxy did not start: see {log.name}")


def empty_app() -> None:
    """A Serve application at ``/empty`` that reads the body and answers a fixed completion: Serve's own path."""
    from ray import serve
    from starlette.responses import Response

    answer = json.dumps({"id": "x", "object": "chat.completion", "model": "standin", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "391"}, "finish_reason": "stop"}]}).encode()

    @serve.deployment
    class Empty:
        async def __call__(self, request):
            await request.body()
            return Response(answer, media_type="application/json")

    serve.run(Empty.bind(), name="empty", route_prefix="/empty")

    from fastapi import FastAPI, Request

    api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    async def chat(request):
        await request.body()
        return Response(answer, media_type="application/json")

    chat.__annotations__ = {"request": Request}  # the class itself: this module's annotations are strings
    api.post("/v1/chat/completions")(chat)

    @serve.deployment(ray_actor_options={"num_cpus": 0})  # beside the others on the machine's CPUs
    @serve.ingress(api)
    class EmptyFastAPI:
        """The same answer through a FastAPI app, as proxray's ingress is one (``@serve.ingress``)."""

    serve.run(EmptyFastAPI.bind(), name="empty-fastapi", route_prefix="/empty-fastapi")


def proxray_app(upstream: str, front: str) -> tuple[str, str, callable]:
    from bench_serve import start_demo_app
    from proxray.serve.front import FRONT
    from proxray.serve.tenancy.keys import new_key_entry

    os.environ.update({name: ("1" if front == "haproxy" else "0") for name in FRONT})  # before Ray starts

    keys = os.path.join(tempfile.mkdtemp(), "keys.yaml")
    key = new_key_entry(keys, "bench", budget={"usd": 1e6})
    open_key = new_key_entry(keys, "open")
    model = {"id": "standin", "engine": "openai", "base_url": upstream, "timeout_s": 10,
             "price": {"input_per_mtok": 1.0, "output_per_mtok": 1.0}}
    chat_url, _, stop = start_demo_app(encoder="static", extra_models=[model], new_models=["standin"], keys_file=keys)
    empty_app()
    return chat_url.replace("/v1/chat/completions", ""), key, open_key, stop


def run(target: dict, n: int, concurrency: int) -> list:
    body = json.dumps({"model": target["model"], "messages": [{"role": "user", "content": "What is 17 * 23?"}],
                       "max_tokens": 8}).encode()

    def one(_):
        t0 = time.perf_counter()
        r = target["client"].post(target.get("path", "/v1/chat/completions"), content=body)
        total = 1e3 * (time.perf_counter() - t0)
        ok = r.status_code == 200
        if not ok:
            target.setdefault("failures", {}).setdefault(r.status_code, r.text[:300])
        if ok and "stages" in target:  # the ingress's own account: its time, and the model's (or relay's) in it
            report = r.json()["proxray"]
            target["stages"].append((total, 1e3 * report["latency_s"], report["timings"]))
        return total, ok

    with ThreadPoolExecutor(concurrency) as pool:
        res = list(pool.map(one, range(n)))
    target["errors"] += sum(not ok for _, ok in res)
    return [t for t, _ in res]


def stages(samples: list, direct_p50: float) -> dict:
    """Where a proxray request's time goes, medians in ms, from the ingress's report on each answer: ``front`` (the
    client's time less the ingress handler's: Serve's front, HTTP, the answer's serialisation and charge),
    ``ingress`` (the handler before the model: key, body, policy, hold, the encoder and router when routed),
    ``model`` (the model's answer through the relay or the deployment's handle) less a direct call's p50."""
    med = lambda xs: round(statistics.median(xs), 2)  # noqa: E731
    out = {"front_ms": med([t - lat for t, lat, _ in samples]),
           "ingress_ms": med([lat - tm["model_ms"] for _, lat, tm in samples]),
           "model_over_direct_ms": med([tm["model_ms"] - direct_p50 for _, _, tm in samples])}
    for name in ("read_ms", "parse_ms", "embed_ms", "estimate_ms"):
        if any(name in tm for _, _, tm in samples):
            out[name] = med([tm.get(name, 0.0) for _, _, tm in samples])
    return out


def saturate(target: dict, clients: int, seconds: float) -> dict:
    """``clients`` threads sending back to back for ``seconds``: answers a second and failures."""
    body = json.dumps({"model": target["model"], "messages": [{"role": "user", "content": "What is 17 * 23?"}],
                       "max_tokens": 8}).encode()
    end = time.perf_counter() + seconds

    def loop(_):
        ok = bad = 0
        while time.perf_counter() < end:
            r = target["client"].post(target.get("path", "/v1/chat/completions"), content=body)
            ok, bad = ok + (r.status_code == 200), bad + (r.status_code != 200)
            if r.status_code != 200:
                target.setdefault("failures", {}).setdefault(r.status_code, r.text[:300])
        return ok, bad

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        res = list(pool.map(loop, range(clients)))
    took = time.perf_counter() - t0
    return {"per_s": round(sum(ok for ok, _ in res) / took, 1), "errors": sum(bad for _, bad in res)}


def pct(lat, q):
    lat = sorted(lat)
    return lat[min(len(lat) - 1, int(q * (len(lat) - 1)))]


def summarize(paths: list) -> None:
    """The runs' figures side by side, and the median over runs of proxray's added latency ÷ LiteLLM's (runs made
    before ``--front`` existed went through Serve's Python proxy)."""
    runs = [json.load(open(p)) for p in paths]
    for front, upstream in sorted({(r.get("front", "proxy"), r["upstream"]) for r in runs}):
        mine = [r for r in runs if r.get("front", "proxy") == front and r["upstream"] == upstream]
        print(f"\nfront {front}, upstream {upstream} ({len(mine)} runs; {mine[0]['hardware']})")
        print("| c | LiteLLM added p50 / p95 | proxray named added p50 / p95 | ratio p50 | ratio p95 | "
              "Serve empty app added p50 | proxray co-hosted added p50 | proxray routed added p50 |")
        print("|---|---|---|---|---|---|---|---|")
        for c in mine[0]["by_concurrency"]:
            rows = [r["by_concurrency"][c] for r in mine]
            ratio = {q: statistics.median(x["proxray, named"][f"added_{q}_ms"] / x["LiteLLM"][f"added_{q}_ms"]
                                          for x in rows) for q in ("p50", "p95")}

            def cell(name, q):
                return "/".join(f"{x[name][f'added_{q}_ms']:.1f}" if name in x else "–" for x in rows)

            print(f"| {c} | {cell('LiteLLM', 'p50')} / {cell('LiteLLM', 'p95')} | {cell('proxray, named', 'p50')} / "
                  f"{cell('proxray, named', 'p95')} | {ratio['p50']:.2f} | {ratio['p95']:.2f} | "
                  f"{cell('Serve, empty app', 'p50')} | {cell('proxray, co-hosted', 'p50')} | "
                  f"{cell('proxray, routed', 'p50')} |")


def main(argv=None):
    import httpx

    from proxray.common.quickack import sync_transport

    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--summarize":
        return summarize(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--litellm", required=True, help="LiteLLM's proxy command (litellm in its own environment)")
    p.add_argument("--requests", type=int, default=300, help="per target and concurrency, over all rounds")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--rounds", type=int, default=3, help="interleaving: each target's requests in this many turns")
    p.add_argument("--nagle", action="store_true", help="the upstream writes with Nagle on (default: TCP_NODELAY)")
    p.add_argument("--front", default="haproxy", choices=["haproxy", "proxy"],
                   help="how HTTP reaches Serve's replicas: its HAProxy ingress (proxray's default) or its Python proxy")
    p.add_argument("--saturate", type=int, default=32, help="clients of the saturation phase (0: none)")
    p.add_argument("--saturate-s", type=float, default=5.0, help="seconds of the saturation phase, per target")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    upstream = f"http://127.0.0.1:{standin(nodelay=not a.nagle)}/v1"
    lite_url, lite = litellm_proxy(a.litellm, upstream)
    base, key, open_key, stop = proxray_app(upstream, a.front)
    auth, unrestricted = {"Authorization": f"Bearer {key}"}, {"Authorization": f"Bearer {open_key}"}

    def client(url, headers=None):
        return httpx.Client(base_url=url, headers=headers, timeout=30, transport=sync_transport(
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=32)))

    targets = {"direct": {"client": client(upstream.removesuffix("/v1")), "model": "standin"},
               "LiteLLM": {"client": client(lite_url, {"Authorization": f"Bearer {MASTER}"}), "model": "standin"},
               "Serve, empty app": {"client": client(base), "model": "standin", "path": "/empty/v1/chat/completions"},
               "Serve, empty FastAPI app": {"client": client(base), "model": "standin",
                                            "path": "/empty-fastapi/v1/chat/completions"},
               "proxray, named": {"client": client(base, unrestricted), "model": "standin", "stages": []},
               "proxray, budgeted": {"client": client(base, auth), "model": "standin", "stages": []},
               "proxray, co-hosted": {"client": client(base, auth), "model": SIM, "stages": []},
               "proxray, routed": {"client": client(base, auth), "model": "proxray", "stages": []}}
    results = {"hardware": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, {platform.system()}",
               "upstream": "Nagle on, headers and body apart" if a.nagle else "TCP_NODELAY", "front": a.front,
               "by_concurrency": {}}
    try:
        for t in targets.values():  # warm-up: connections, the app's first requests
            t["errors"] = 0
            run(t, 30, 4)
            t["errors"] = 0
            if "stages" in t:
                t["stages"] = []
        for conc in [int(c) for c in a.concurrency.split(",")]:
            lat = {name: [] for name in targets}
            for _ in range(a.rounds):
                for name, t in targets.items():
                    lat[name] += run(t, a.requests // a.rounds, conc)
            d = {q: pct(lat["direct"], q) for q in (0.5, 0.95, 0.99)}
            rows = {}
            for name, values in lat.items():
                row = {f"p{int(q * 100)}_ms": round(pct(values, q), 2) for q in (0.5, 0.95, 0.99)}
                row.update({f"added_p{int(q * 100)}_ms": round(pct(values, q) - d[q], 2) for q in (0.5, 0.95, 0.99)})
                row["errors"] = targets[name]["errors"]
                if "stages" in targets[name]:
                    row["stages"] = stages(targets[name]["stages"], d[0.5])
                    targets[name]["stages"] = []
                rows[name] = row
            results["by_concurrency"][conc] = rows
            print(f"\n| c={conc} ({results['upstream']}; {results['hardware']}) | p50 | p95 | p99 | added p50 | "
                  "added p95 | errors |")
            print("|---|---|---|---|---|---|---|")
            for name, r in rows.items():
                print(f"| {name} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['added_p50_ms']} | "
                      f"{r['added_p95_ms']} | {r['errors']} |")
            lp, pp = rows["LiteLLM"]["added_p50_ms"], rows["proxray, named"]["added_p50_ms"]
            print(f"proxray named ÷ LiteLLM, added p50: {pp / lp:.2f}" if lp > 0 else "")
            bp = rows["proxray, budgeted"]["added_p50_ms"]
            print(f"proxray budgeted ÷ named, added p50: {bp / pp:.2f}" if pp > 0 else "")
            for name, r in rows.items():
                if "stages" in r:
                    print(f"  where {name}'s time goes (medians, ms): "
                          + ", ".join(f"{k.removesuffix('_ms')} {v}" for k, v in r["stages"].items()))
        if a.saturate:
            sat = {name: saturate(targets[name], a.saturate, a.saturate_s)
                   for name in ("direct", "LiteLLM", "Serve, empty app", "Serve, empty FastAPI app", "proxray, named",
                                "proxray, budgeted")}
            results["saturation"] = {"clients": a.saturate, "seconds": a.saturate_s, **sat}
            print(f"\nsaturation, {a.saturate} clients: " + ", ".join(
                f"{name} {r['per_s']}/s ({r['errors']} failed)" for name, r in sat.items()))
    finally:
        stop()
        os.killpg(lite.pid, 15)
    failures = {name: t["failures"] for name, t in targets.items() if t.get("failures")}
    if failures:
        results["failures"] = failures
        print("failures, the first of each status:", json.dumps(failures, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
