"""Where the ingress replica's CPU goes at saturation: the CPU demo app behind Serve's HAProxy front, 32 clients sending
the named pass-through (``model: standin``, an ``engine: openai`` pool member relayed to a stand-in upstream that
answers at once) back to back, while py-spy samples the ingress replica. Each sample goes to one part of the stack by
the innermost frame it can place (the event loop's native code, the relay's HTTP client, Serve's replica wrapper, the
HTTP server, proxray's own request path, Ray's core, metrics, logging).

    python bench/profile_saturation.py --py-spy $(which py-spy) --json research/benchmarks/gateways/saturation-profile.json

py-spy is not a dependency (``pip install py-spy`` anywhere); it must be allowed to read the replica's memory (root,
or ``ptrace_scope`` 0). Also reported: answers a second directly, through Serve's empty app and through proxray, and
the ingress replica's CPU seconds per answer while py-spy was not running."""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gateways import proxray_app, saturate  # noqa: E402
from bench_relay_stall import standin  # noqa: E402

# (part, test on a frame's "function (file:line)"), the innermost frame that matches names the sample's part; the leaf
# alone decides the first four (native code is reported as the Python frame that called it)
LEAF = (("the event loop's native code (uvloop)", lambda f: f.startswith("Thread.run ")),
        ("Ray's core worker loop", lambda f: f.startswith("Worker.main_loop ")),
        ("logging (Serve's access log)", lambda f: "/logging/" in f or "genericpath" in f or "Unbuffered" in f),
        ("metrics (Serve's, Ray's)", lambda f: "ray/util/metrics" in f or "Metric." in f))
STACK = (("the relay's HTTP client (httpx, httpcore)", ("httpx/", "httpcore/", "quickack")),
         ("proxray's request path", ("proxray/",)),
         ("the HTTP server (uvicorn, Starlette, FastAPI)", ("uvicorn/", "starlette/", "fastapi/", "anyio/")),
         ("Serve's replica wrapper", ("ray/serve/",)),
         ("Ray's core (Python)", ("ray/",)))


def part(frames: list) -> str:
    for name, test in LEAF:
        if test(frames[-1]):
            return name
    for frame in reversed(frames):
        for name, marks in STACK:
            if any(m in frame for m in marks):
                return name
    return "other"


def parts(raw: str) -> dict:
    """{part: share of the samples} from py-spy's raw output (``stack;stack;... count`` per line)."""
    counts, total = collections.Counter(), 0
    for line in open(raw):
        line = line.rstrip()
        if line:
            stack, n = line.rsplit(" ", 1)
            counts[part(stack.split(";"))] += int(n)
            total += int(n)
    return {name: round(n / total, 3) for name, n in counts.most_common()} | {"samples": total}


def main(argv=None):
    import httpx
    import psutil

    from proxray.common.quickack import sync_transport

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--py-spy", required=True, help="py-spy's command")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=8.0, help="of each saturation phase")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    upstream = f"http://127.0.0.1:{standin(nodelay=True)}/v1"
    base, _, open_key, stop = proxray_app(upstream, "haproxy")

    def client(url, headers=None):
        return httpx.Client(base_url=url, headers=headers, timeout=30, transport=sync_transport(
            limits=httpx.Limits(max_connections=a.clients, max_keepalive_connections=a.clients)))

    targets = {"direct": {"client": client(upstream.removesuffix("/v1")), "model": "standin"},
               "Serve, empty app": {"client": client(base), "model": "standin", "path": "/empty/v1/chat/completions"},
               "proxray, named": {"client": client(base, {"Authorization": f"Bearer {open_key}"}), "model": "standin"}}
    out = {"hardware": f"{os.cpu_count()} CPUs", "clients": a.clients, "seconds": a.seconds}
    try:
        for t in targets.values():
            saturate(t, 4, 2.0)  # warm-up: connections, the app's first requests
        out["per_s"] = {name: saturate(t, a.clients, a.seconds)["per_s"] for name, t in targets.items()}
        pid = next(p.pid for p in psutil.process_iter(["cmdline"]) if "RouterIngress" in " ".join(
            p.info["cmdline"] or []))
        ingress = psutil.Process(pid)
        before = sum(ingress.cpu_times()[:2])
        done = saturate(targets["proxray, named"], a.clients, a.seconds)
        out["ingress_cpu_ms_per_answer"] = round(1e3 * (sum(ingress.cpu_times()[:2]) - before)
                                                 / (done["per_s"] * a.seconds), 2)
        raw = os.path.join(tempfile.mkdtemp(), "ingress.raw")
        spy = subprocess.Popen([a.py_spy, "record", "-p", str(pid), "-d", str(int(a.seconds)), "-r", "200", "-f", "raw",
                                "-o", raw, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attached
        out["per_s_sampled"] = saturate(targets["proxray, named"], a.clients, a.seconds)["per_s"]
        spy.wait()
        out["ingress_cpu"] = parts(raw)
    finally:
        stop()
    from report import emit

    emit(out, a.json)


if __name__ == "__main__":
    main()
