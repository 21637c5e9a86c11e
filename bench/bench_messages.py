"""What Anthropic's Messages API costs over chat completions on the routed endpoint at 127.0.0.1 (not a timed test),
and Claude Code itself answering through it.

    python bench/bench_messages.py [--encoder static] [--requests 200] [--concurrency 1,8] [--claude PATH]

Starts the cpu_demo application (bench_serve.start_demo_app: four simulated models, Claude Code's model ids mapped
by ``model_aliases``) and at each ``--concurrency`` sends ``--requests`` requests in four modes, interleaved over two
rounds: chat completions and Messages passed through to the same sim model (the translation is what differs), and
both routed, every request with a key of the app's keys file (held and charged). Prints req/s and p50/p99 latency per mode and the ratio to chat's p50. With ``--claude`` (the Claude Code
CLI, ``npm install @anthropic-ai/claude-code``), runs ``claude -p "What is 2 + 2?"`` in print mode against the app
(``ANTHROPIC_BASE_URL``; nothing else leaves the machine) and prints what it answered and the requests it made.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_serve import load, start_demo_app  # noqa: E402

MODEL = "meta-llama/Llama-3.2-1B-Instruct"
ALIASES = {"claude-*haiku*": {"model": "proxray", "lam": 10000}, "claude-*": {"model": "proxray"}}


def claude_code(binary: str, base: str, key: str) -> dict:
    """``claude -p`` against the app with a key of its keys file: its exit status, answer and time."""
    env = {**os.environ, "ANTHROPIC_BASE_URL": base, "ANTHROPIC_AUTH_TOKEN": key,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "HOME": os.environ["HOME"]}
    t0 = time.perf_counter()
    r = subprocess.run([binary, "-p", "What is 2 + 2?"], env=env, capture_output=True, text=True, timeout=300)
    return {"rc": r.returncode, "answer": r.stdout.strip()[:500], "stderr": r.stderr.strip()[-500:],
            "seconds": round(time.perf_counter() - t0, 2)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--encoder", default="static")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--claude", default=None, help="the Claude Code CLI (claude) to run against the app")
    a = p.parse_args(argv)
    import tempfile

    from proxray.serve.tenancy.keys import new_key_entry

    keys = os.path.join(tempfile.mkdtemp(), "keys.yaml")
    key = new_key_entry(keys, "bench", budget={"usd": 1000.0})  # every request keyed, held and charged
    chat_url, prompts, stop = start_demo_app(encoder=a.encoder, model_aliases=ALIASES, keys_file=keys)
    auth = {"Authorization": f"Bearer {key}"}
    url = chat_url.replace("/chat/completions", "/messages")
    text = lambda i: prompts[i % len(prompts)]  # noqa: E731
    chat = lambda model: lambda i: {"model": model, "messages": [{"role": "user", "content": text(i)}],  # noqa: E731
                                    "max_tokens": 16}
    modes = {"chat": (chat_url, chat(MODEL)), "messages": (url, chat(MODEL)),
             "chat, routed": (chat_url, chat("proxray")), "messages, routed": (url, chat("claude-sonnet-4-5"))}
    load(chat_url, modes["chat"][1], 40, 8, auth)  # warm-up
    load(url, modes["messages"][1], 40, 8, auth)
    for conc in [int(c) for c in a.concurrency.split(",")]:
        rows = {}
        for _ in range(2):
            for mode, (u, body) in modes.items():
                rows.setdefault(mode, []).append(load(u, body, a.requests, conc, auth))
        print(f"\n| mode | requests | errors | req/s | p50 ms | p99 ms | p50 ÷ chat |  (concurrency {conc}, "
              f"{os.cpu_count()} CPUs, sim models)")
        print("|---|---|---|---|---|---|---|")
        base = {m: min(r["p50_ms"] for r in rows[m]) for m in ("chat", "chat, routed")}
        for mode, runs in rows.items():
            r = min(runs, key=lambda x: x["p50_ms"])
            ref = base["chat, routed" if "routed" in mode else "chat"]
            print(f"| {mode} | {sum(x['requests'] for x in runs)} | {sum(x['errors'] for x in runs)} | "
                  f"{r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['p50_ms'] / ref:.2f} |")
    if a.claude:
        print("\nclaude -p:", claude_code(a.claude, chat_url.replace("/v1/chat/completions", ""), key))
    stop()


if __name__ == "__main__":
    main()
