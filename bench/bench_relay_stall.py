"""The delayed-ACK stall against an upstream that writes its headers and body apart with Nagle on (not a timed test).

    python bench/bench_relay_stall.py [--requests 200]

A stand-in upstream on 127.0.0.1 answers a chat completion in two writes (headers, then body) on a keep-alive
connection, Nagle on (``--nodelay`` turns it off: the well-behaved case). Measured, one request at a time: httpx as it
is, aiohttp (what LiteLLM's client builds on) and httpx on ``proxray.common.quickack``'s transport (the relay's and
the evaluation job's); then the routed app (the CPU demo's router, the stand-in as an ``engine: openai`` pool member)
with a request naming it, so the relay's path is measured end to end. Prints p50 / p95 per client.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))

BODY = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": "standin",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()


def standin(nodelay: bool) -> int:
    """The upstream: every answer's headers and body in two writes; returns its port."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)

    def conn(c):
        if nodelay:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = c.recv(65536)
                if not data:
                    return
                buf += data
            head, _, rest = buf.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            while len(rest) < length:
                rest += c.recv(65536)
            buf = rest[length:]
            if head.startswith(b"GET"):
                body = json.dumps({"object": "list", "data": [{"id": "standin"}]}).encode()
            else:
                body = BODY
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
            c.sendall(body)

    def accept():
        while True:
            c, _ = srv.accept()
            threading.Thread(target=conn, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return srv.getsockname()[1]


def summary(lat: list) -> str:
    lat = sorted(lat)
    return f"p50 {statistics.median(lat):.2f} ms, p95 {lat[int(0.95 * (len(lat) - 1))]:.2f} ms"


async def clients(url: str, n: int) -> dict:
    import aiohttp
    import httpx

    from proxray.common.quickack import async_transport

    body = {"model": "standin", "messages": [{"role": "user", "content": "hi"}]}
    out = {}
    for name, transport in (("httpx", None), ("httpx + quickack", async_transport())):
        async with httpx.AsyncClient(transport=transport) as client:
            lat = []
            for _ in range(n):
                t0 = time.perf_counter()
                (await client.post(f"{url}/v1/chat/completions", json=body)).read()
                lat.append(1e3 * (time.perf_counter() - t0))
        out[name] = summary(lat[10:])
    async with aiohttp.ClientSession() as s:
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            async with s.post(f"{url}/v1/chat/completions", json=body) as r:
                await r.read()
            lat.append(1e3 * (time.perf_counter() - t0))
    out["aiohttp"] = summary(lat[10:])
    return out


def through_the_app(port: int, n: int) -> str:
    import httpx

    from bench_serve import start_demo_app

    model = {"id": "standin", "engine": "openai", "base_url": f"http://127.0.0.1:{port}/v1", "timeout_s": 10}
    chat_url, _, stop = start_demo_app(encoder="static", extra_models=[model], new_models=["standin"])
    try:
        body = {"model": "standin", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        lat = []
        with httpx.Client(timeout=30) as client:
            for _ in range(n):
                t0 = time.perf_counter()
                client.post(chat_url, json=body).raise_for_status()
                lat.append(1e3 * (time.perf_counter() - t0))
        return summary(lat[10:])
    finally:
        stop()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--nodelay", action="store_true", help="the upstream sets TCP_NODELAY (no stall to meet)")
    p.add_argument("--no-app", action="store_true", help="the clients alone")
    a = p.parse_args(argv)
    port = standin(a.nodelay)
    print(f"upstream: headers and body apart, Nagle {'off' if a.nodelay else 'on'}; {os.cpu_count()} CPUs")
    for name, s in asyncio.run(clients(f"http://127.0.0.1:{port}", a.requests)).items():
        print(f"  {name:18s} {s}")
    if not a.no_app:
        print(f"  {'through proxray':18s} {through_the_app(port, a.requests)}  (a request naming the pool member)")


if __name__ == "__main__":
    main()
