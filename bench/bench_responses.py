"""What the Responses API costs over chat completions on the routed endpoint at 127.0.0.1 (not a timed test).

    python bench/bench_responses.py [--encoder static] [--requests 200] [--concurrency 1,8]

Starts the cpu_demo application (bench_serve.start_demo_app: four simulated models) and at each ``--concurrency``
sends ``--requests`` requests in five modes, interleaved over two rounds, all passed through to the same sim model
(so the gateway's own work is what differs): chat completions; Responses with ``store: false`` (the translation
alone); Responses stored (one call to the store before the answer goes out); Responses continuing a stored response
by ``previous_response_id`` (the conversation read from the store, then the new one stored); and routed Responses
(``model: proxray``, stored). Prints req/s and p50/p99 latency per mode and the ratio to chat's p50.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from bench_serve import load, start_demo_app  # noqa: E402

MODEL = "meta-llama/Llama-3.2-1B-Instruct"


def main(argv=None):
    import httpx

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--encoder", default="static")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", default="1,8")
    a = p.parse_args(argv)
    chat_url, prompts, stop = start_demo_app(encoder=a.encoder)
    url = chat_url.replace("/chat/completions", "/responses")
    text = lambda i: prompts[i % len(prompts)]  # noqa: E731
    firsts = [httpx.post(url, json={"model": MODEL, "input": text(i), "max_output_tokens": 16}, timeout=30).json()["id"]
              for i in range(2 * a.requests)]  # conversations to continue, one per continuing request
    turn = iter(firsts)
    modes = {
        "chat": (chat_url, lambda i: {"model": MODEL, "messages": [{"role": "user", "content": text(i)}],
                                      "max_tokens": 16}),
        "responses, store false": (url, lambda i: {"model": MODEL, "input": text(i), "store": False,
                                                   "max_output_tokens": 16}),
        "responses, stored": (url, lambda i: {"model": MODEL, "input": text(i), "max_output_tokens": 16}),
        "responses, continued": (url, lambda i: {"model": MODEL, "input": "And then?", "max_output_tokens": 16,
                                                 "previous_response_id": next(turn)}),
        "responses, routed": (url, lambda i: {"model": "proxray", "input": text(i), "max_output_tokens": 16}),
    }
    load(chat_url, modes["chat"][1], 40, 8)  # warm-up
    for conc in [int(c) for c in a.concurrency.split(",")]:
        rows = {}
        for _ in range(2):
            for mode, (u, body) in modes.items():
                rows.setdefault(mode, []).append(load(u, body, a.requests // 2 if mode == "responses, continued"
                                                      else a.requests, conc))
        print(f"\n| mode | requests | errors | req/s | p50 ms | p99 ms | p50 ÷ chat |  (concurrency {conc}, "
              f"{os.cpu_count()} CPUs, sim models)")
        print("|---|---|---|---|---|---|---|")
        base = min(r["p50_ms"] for r in rows["chat"])
        for mode, runs in rows.items():
            r = min(runs, key=lambda x: x["p50_ms"])
            print(f"| {mode} | {sum(x['requests'] for x in runs)} | {sum(x['errors'] for x in runs)} | "
                  f"{r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['p50_ms'] / base:.2f} |")
    stop()


if __name__ == "__main__":
    main()
