"""One key's latency while another key sends 1-MB bodies (not a timed test).

    python bench/bench_tenants.py [--requests 200] [--every-s 0.2] [--body-mb 1.0] [--rounds 2]

Starts the cpu_demo application (bench_serve.start_demo_app: four simulated models) with a keys file of two keys,
each with a budget (so each request is identified, held and charged). Key B sends ``--requests`` routed chat
completions one at a time, first alone, then while key A sends a Responses request of ``--body-mb`` MB of text (within
the app's 1-MiB body limit, so it is read, validated, embedded, routed and answered) every ``--every-s`` seconds;
``--rounds`` times, alternating. Prints B's p50 / p95 in each phase, the ratio of the p95s and what A's requests got
(over the app's 200,000 characters of input, each is read, parsed and refused: a 400).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_serve import start_demo_app  # noqa: E402

MODEL = "meta-llama/Llama-3.2-1B-Instruct"


def latencies(client, url, body, n) -> list:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        r = client.post(url, json=body(i))
        assert r.status_code == 200, r.text[:300]
        out.append(1e3 * (time.perf_counter() - t0))
    return out


def summary(ms: list) -> dict:
    ms = sorted(ms)
    return {"p50_ms": round(statistics.median(ms), 2), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 2)}


def main(argv=None):
    import httpx

    from proxray.serve.tenancy.keys import new_key_entry

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--every-s", type=float, default=0.2)
    p.add_argument("--body-mb", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)
    keys = os.path.join(tempfile.mkdtemp(), "keys.yaml")
    key_a, key_b = (new_key_entry(keys, name, budget={"usd": 1000.0}) for name in ("a", "b"))
    chat_url, prompts, stop = start_demo_app(encoder="static", keys_file=keys)
    responses_url = chat_url.replace("/chat/completions", "/responses")
    b = httpx.Client(timeout=60, headers={"Authorization": f"Bearer {key_b}"})
    asked = lambda i: {"model": "proxray", "max_tokens": 16,  # noqa: E731
                       "messages": [{"role": "user", "content": prompts[i % len(prompts)]}]}
    text = ("Summarise this report. " * 50_000)[:int(a.body_mb * 1e6)]
    try:
        latencies(b, chat_url, asked, 40)  # warm-up
        phases = {"alone": [], "beside 1-MB bodies": []}
        codes: dict = {}
        refused: dict = {}  # a status other than 200: its first message
        for _ in range(a.rounds):
            phases["alone"] += latencies(b, chat_url, asked, a.requests)
            done = threading.Event()

            def noisy():
                with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {key_a}"}) as c:
                    while not done.is_set():
                        t0 = time.perf_counter()
                        r = c.post(responses_url, json={"model": MODEL, "input": text, "max_output_tokens": 16})
                        codes[r.status_code] = codes.get(r.status_code, 0) + 1
                        if r.status_code != 200:
                            refused.setdefault(r.status_code, r.json()["error"]["message"][:200])
                        done.wait(max(0.0, a.every_s - (time.perf_counter() - t0)))

            t = threading.Thread(target=noisy, daemon=True)
            t.start()
            time.sleep(1.0)  # A's load under way
            phases["beside 1-MB bodies"] += latencies(b, chat_url, asked, a.requests)
            done.set()
            t.join()
        rows = {name: summary(ms) for name, ms in phases.items()}
        rows["p95 ratio"] = round(rows["beside 1-MB bodies"]["p95_ms"] / rows["alone"]["p95_ms"], 2)
        rows["key A's answers"] = codes
        rows["key A's refusals"] = refused
        rows["settings"] = vars(a)
        print(json.dumps(rows, indent=1))
    finally:
        stop()


if __name__ == "__main__":
    main()
