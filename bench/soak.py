"""Soak: a bounded run of routed requests on 127.0.0.1 with the memory of the Serve replicas sampled
before and after (not a timed test).

    python bench/soak.py [--requests 20000] [--concurrency 8]

Uses the same app as bench/bench_serve.py (four simulated models, kNN router over MiniLM embeddings).
Prints requests, errors, throughput, and the summed RSS of the Serve replica processes after a
warm-up and at the end, with samples along the way.
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def rss_mb():
    import psutil

    return sum(p.memory_info().rss for p in psutil.process_iter(["cmdline"])
               if "ServeReplica:proxray" in " ".join(p.info["cmdline"] or [])) / 2**20


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=8)
    a = p.parse_args(argv)
    from bench_serve import load, start_demo_app  # same folder

    url, prompts, stop = start_demo_app()

    def body(i):
        return {"model": "proxray", "messages": [{"role": "user", "content": prompts[i % len(prompts)]}]}

    load(url, body, 500, a.concurrency)  # warm-up
    before, samples, errors, t0 = rss_mb(), [], 0, time.time()
    chunk = max(1, a.requests // 10)
    for s in range(0, a.requests, chunk):
        errors += load(url, body, min(chunk, a.requests - s), a.concurrency)["errors"]
        samples.append(round(rss_mb(), 1))
    wall = time.time() - t0
    res = {"requests": a.requests, "errors": errors, "rps": round(a.requests / wall, 1), "rss_before_mb": round(before, 1),
           "rss_after_mb": samples[-1], "growth_mb": round(samples[-1] - before, 1), "samples_mb": samples}
    print(json.dumps(res))
    stop()


if __name__ == "__main__":
    main()
