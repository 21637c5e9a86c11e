"""The ingress replica's CPU per request (not a timed test): what the request path costs the process that runs it.

    python bench/ingress_cpu.py [--requests 400] [--rounds 3] [--json out.json]

The CPU demo app (the static encoder, a keys file with a key that has a budget) on a local Serve, behind Serve's
HAProxy front, with a stand-in OpenAI upstream on 127.0.0.1 as an ``engine: openai`` pool member (relayed from the
ingress's own process). One client sends, one at a time, keyed requests of three kinds: **routed** (``model:
proxray``: encoder, router, plan, hold moved, charge), **named relay** (the upstream by name: key, hold, charge, the
relay in process) and **named co-hosted** (a simulated model by name: its deployment's handle). For each kind, the
ingress replica's CPU time (user + system, ``/proc/<pid>/stat``) over its requests, divided by their number; each
round sends every kind in turn, and the figure is the median over rounds. Run it on two checkouts to compare
(``PYTHONPATH=<checkout>``: the driver and Ray's workers import that one).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from bench_relay_stall import standin  # noqa: E402

SIM = "meta-llama/Llama-3.2-1B-Instruct"  # one of the CPU demo's simulated models


def cpu_ms(pid: int) -> float:
    """User + system CPU of process ``pid`` so far, ms."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf("SC_CLK_TCK")


def ingress_pid() -> int:
    """The ingress replica's process (the GCS's actor table: no dashboard needed)."""
    from ray._private.state import actors

    alive = [a for a in actors().values() if a["ActorClassName"].endswith("RouterIngress") and a["State"] == "ALIVE"]
    assert len(alive) == 1, alive
    return int(alive[0]["Pid"])


def main(argv=None):
    import httpx

    from bench_serve import start_demo_app
    from proxray.common.quickack import sync_transport
    from proxray.serve.front import FRONT
    from proxray.serve.tenancy.keys import new_key_entry

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=400, help="per kind and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    os.environ.update({name: "1" for name in FRONT})  # Serve's HAProxy front, as proxray's clusters run
    upstream = f"http://127.0.0.1:{standin(nodelay=True)}/v1"
    keys = os.path.join(tempfile.mkdtemp(), "keys.yaml")
    key = new_key_entry(keys, "bench", budget={"usd": 1e6})
    model = {"id": "standin", "engine": "openai", "base_url": upstream, "timeout_s": 10,
             "price": {"input_per_mtok": 1.0, "output_per_mtok": 1.0}}
    chat_url, prompts, stop = start_demo_app(encoder="static", extra_models=[model], new_models=["standin"],
                                             keys_file=keys)
    kinds = {"routed": "proxray", "named relay": "standin", "named co-hosted": SIM}
    per = {k: [] for k in kinds}
    try:
        client = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}, transport=sync_transport())
        pid = ingress_pid()

        def send(model, n):
            for i in range(n):
                r = client.post(chat_url, json={"model": model, "max_tokens": 8,
                                                "messages": [{"role": "user", "content": prompts[i % len(prompts)]}]})
                r.raise_for_status()

        for model in kinds.values():  # warm-up: connections, caches, the first requests' imports
            send(model, 50)
        for _ in range(a.rounds):
            for kind, model in kinds.items():
                c0 = cpu_ms(pid)
                send(model, a.requests)
                per[kind].append((cpu_ms(pid) - c0) / a.requests)
    finally:
        stop()
    out = {"hardware": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, {platform.system()}",
           "requests_per_round": a.requests, "rounds": a.rounds,
           "cpu_ms_per_request": {k: round(statistics.median(v), 3) for k, v in per.items()},
           "per_round": {k: [round(x, 3) for x in v] for k, v in per.items()}}
    from report import emit

    emit(out, a.json)


if __name__ == "__main__":
    main()
