"""What a coding agent's session costs under each way of keeping its model, replayed through the app against stand-in
hosted models that bill prompt caching as Anthropic documents it (not a timed test).

    python bench/bench_sessions.py [--turns 36] [--lam 12] [--scale 50] [--json]

The session is synthesised from the request Claude Code 2.1.328 really sent (``tests/data/claude_code_request.json``:
its system prompt and twelve tools, ~10k tokens, and its cache marks) and grows as Claude Code's do: every turn
resends the whole conversation with a file excerpt in a ``<system-reminder>`` block (~1.9k tokens) and a new ask
(``cache_control`` on the last block), and the answer joins it — past 60,000 tokens by turn 28. Asks come from the
synthetic tasks; three phases of four turns (turns 4–7, 16–19, 28–31) ask multi-step arithmetic (``gsm8k``), which
the small model is poor at, the rest short questions both answer (``svamp``, ``sciq``, ``social_iqa``).

Two stand-in models on 127.0.0.1 (``tests/cache_standin.py``): ``claude-large`` (3 / 15 USD per million input / output
tokens, cache writes 3.75, reads 0.30) and ``claude-small`` (1 / 5; 1.25, 0.10), each its own prompt cache with a
5-minute lifetime refreshed by each read and a 1,024-token minimum. Time is replayed ``--scale`` times faster: turns
75 s apart and a 300 s cache lifetime become 1.5 s and 6 s (``cache_ttl_s`` in the app's prices says the same).

The router (kNN over MiniLM) is fitted on the tasks with the small model at 0.85 / 0.20 estimated accuracy (short /
multi-step) and the large at 0.88 / 0.90, and table costs of a typical short query (0.004 and 0.012 USD). Rules, each
on a fresh cache, at the app's λ: ``per_turn`` (no session: each turn routed alone), ``margin`` (``conversations.rule:
margin``, the fixed margins), ``cache_aware`` (the default rule: each model's cost of the turn is its expected bill
there); then each model alone (named, no routing). Prints a table, or with ``--json`` one line (stdout's last; Ray
may print a line of its own before it at shutdown): ``{rule: {cost_usd, mean_accuracy, cached_share, switches, lam,
scale, turns: [...]}}`` — ``mean_accuracy`` the fitted accuracy of the model that answered each turn's kind of ask,
``cached_share`` the input tokens the stand-in read from cache over all input tokens. ``--horizon`` sets
``conversations.switch_horizon_turns``; ``--rules`` runs some of the rules.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

LARGE, SMALL = "claude-large", "claude-small"
EASY, HARD = ("svamp", "sciq", "social_iqa"), "gsm8k"
ACCURACY = {LARGE: {"easy": 0.88, "hard": 0.90}, SMALL: {"easy": 0.85, "hard": 0.20}}
TABLE_COST = {LARGE: 0.012, SMALL: 0.004}  # a typical short query's: 1.5k tokens in, 0.5k out
HARD_TURNS = set(range(2, 6)) | set(range(16, 20)) | set(range(28, 32))
EXCERPT_CHARS = 7000


def fit_router(path, encoder):
    import numpy as np

    from proxray import KNNRouter
    from proxray.data.synthetic import generate_queries

    q = generate_queries(40, seed=1)
    q = q[q.task.isin(EASY + (HARD,))]
    kind = np.where(q.task == HARD, "hard", "easy")
    acc = np.array([[ACCURACY[m][k] for m in (LARGE, SMALL)] for k in kind])
    cost = np.tile([TABLE_COST[LARGE], TABLE_COST[SMALL]], (len(q), 1))
    KNNRouter(k=10).fit(encoder.encode(list(q.prompt)), acc, cost, models=[LARGE, SMALL], encoder_id=encoder.id,
                        query_ids=list(q.query_id), tasks=list(q.task)).save(path)


def asks(n: int) -> list:
    """The session's asks, turn by turn: (text, kind)."""
    from proxray.data.synthetic import generate_queries

    q = generate_queries(20, seed=7)
    easy = [p for t, p in zip(q.task, q.prompt) if t in EASY]
    hard = [p for t, p in zip(q.task, q.prompt) if t == HARD]
    return [(hard.pop(0), "hard") if i in HARD_TURNS else (easy.pop(0), "easy") for i in range(n)]


def excerpt(i: int) -> str:
    lines, n = [], 0
    while n < EXCERPT_CHARS:
        line = f"    def step_{i}_{len(lines)}(self, value):  # file src/module_{i}.py line {len(lines)}\n"
        lines.append(line)
        n += len(line)
    return "<system-reminder>\nContents of src/module_%d.py:\n%s</system-reminder>" % (i, "".join(lines))


def replay(url: str, standin, turns: list, session: str | None, model: str, gap_s: float) -> dict:
    """One session's turns through the app (``session``: its Claude Code session id, None for none); what each was
    billed, by the stand-in's own account."""
    import httpx

    recorded = json.loads((ROOT / "tests" / "data" / "claude_code_request.json").read_text())["body"]
    standin.reset()
    messages, out = [], []
    headers = {"x-api-key": "unused", "anthropic-version": "2023-06-01"}
    if session:
        headers["X-Claude-Code-Session-Id"] = session
    with httpx.Client(timeout=120) as client:
        for i, (ask, kind) in enumerate(turns):
            t0 = time.monotonic()
            for m in messages:  # the cache mark moves to the newest block, as Claude Code moves it
                for b in m["content"]:
                    b.pop("cache_control", None)
            messages.append({"role": "user", "content": [{"type": "text", "text": excerpt(i)},
                                                         {"type": "text", "text": ask,
                                                          "cache_control": {"type": "ephemeral"}}]})
            body = {"model": model, "max_tokens": 4096, "system": recorded["system"], "tools": recorded["tools"],
                    "messages": messages}
            r = client.post(f"{url}/v1/messages", json=body, headers=headers)
            r.raise_for_status()
            obj = r.json()
            report = obj.get("proxray", {})
            answered, usage, usd = standin.billed[-1]
            prompt = usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0) + \
                usage.get("cache_creation_input_tokens", 0)
            conv = report.get("conversation") or {}
            acc = ACCURACY[answered][kind]
            out.append({"turn": i, "kind": kind, "model": answered, "usd": usd, "prompt_tokens": prompt,
                        "cached_tokens": usage.get("cache_read_input_tokens", 0),
                        "written_tokens": usage.get("cache_creation_input_tokens", 0), "accuracy": acc,
                        "estimated_accuracy": (report.get("estimates") or {}).get(answered, {}).get("accuracy"),
                        "action": conv.get("action"), "why": conv.get("why"),
                        "expected_cached_tokens": (conv.get("cache") or {}).get("expected_cached_tokens")})
            messages.append({"role": "assistant", "content": [{"type": "text", "text": obj["content"][0]["text"]}]})
            time.sleep(max(0.0, gap_s - (time.monotonic() - t0)))
    models = [t["model"] for t in out]
    routed = [t["estimated_accuracy"] for t in out if t["estimated_accuracy"] is not None]
    return {"cost_usd": round(sum(t["usd"] for t in out), 4),
            "mean_accuracy": round(sum(t["accuracy"] for t in out) / len(out), 4),
            "mean_router_estimate": round(sum(routed) / len(routed), 4) if routed else None,
            "cached_share": round(sum(t["cached_tokens"] for t in out) / sum(t["prompt_tokens"] for t in out), 4),
            "switches": sum(a != b for a, b in zip(models, models[1:])),
            "final_prompt_tokens": out[-1]["prompt_tokens"], "turns": out}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=36)
    p.add_argument("--lam", type=float, default=12.0)
    p.add_argument("--scale", type=float, default=50.0, help="replay this many times faster than the session ran")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--rules", default="per_turn,margin,cache_aware,large_alone,small_alone")
    p.add_argument("--horizon", type=float, default=None, help="conversations.switch_horizon_turns (default: the app's)")
    a = p.parse_args(argv)
    import ray
    from ray import serve

    from cache_standin import PRICES, CacheStandIn
    from proxray import SentenceEncoder
    from proxray.serve.app import build
    from proxray.serve.front import free_port

    ttl_s, gap_s = 300.0 / a.scale, 75.0 / a.scale
    tmp = Path(tempfile.mkdtemp(prefix="bench-sessions-"))
    (tmp / "upstream_key").write_text("unused\n")
    os.chmod(tmp / "upstream_key", 0o600)
    standin = CacheStandIn("unused", ttl_s=ttl_s)
    fit_router(tmp / "router", SentenceEncoder())
    models = [{"id": m, "engine": "openai", "source": m, "base_url": standin.url, "protocols": ["messages"],
               "api_key_file": str(tmp / "upstream_key"),
               "price": {"input_per_mtok": PRICES[m]["input"], "output_per_mtok": PRICES[m]["output"],
                         "cache_read_per_mtok": PRICES[m]["cache_read"],
                         "cache_write_per_mtok": PRICES[m]["cache_write"], "cache_ttl_s": ttl_s}}
              for m in (LARGE, SMALL)]
    port = free_port()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled"}})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    turns = asks(a.turns)
    results = {}
    try:
        for rule, app_rule, session, model in (("per_turn", "cache_aware", None, "proxray"),
                                                ("margin", "margin", "margin-session", "proxray"),
                                                ("cache_aware", "cache_aware", "cache-session", "proxray"),
                                                ("large_alone", "cache_aware", None, LARGE),
                                                ("small_alone", "cache_aware", None, SMALL)):
            if rule not in a.rules.split(","):
                continue
            conversations = {"rule": app_rule, **({"switch_horizon_turns": a.horizon} if a.horizon else {})}
            serve.run(build({"router": str(tmp / "router"), "models": models, "lam": a.lam, "timeout_s": 120,
                             "conversations": conversations}), name="proxray", route_prefix="/")
            print(f"[bench] {rule} ...", file=sys.stderr, flush=True)
            results[rule] = replay(url, standin, turns, session, model, gap_s)
    finally:
        serve.shutdown()
        ray.shutdown()
        standin.stop()
    summary = {r: {k: v for k, v in res.items() if k != "turns"} for r, res in results.items()}
    if a.json:
        print(json.dumps({r: {**res, "lam": a.lam, "scale": a.scale} for r, res in results.items()}))
        return
    for r in results:
        print(r, " ".join(f"{t['turn']}:{t['model'][7]}{'*' if t['kind'] == 'hard' else ''}:{t['usd']:.3f}"
                          for t in results[r]["turns"]), file=sys.stderr)
    print(f"λ = {a.lam}, {a.turns} turns, final prompt {next(iter(results.values()))['final_prompt_tokens']} tokens")
    print(f"{'rule':<13}{'USD':>9}{'mean acc':>10}{'cached':>9}{'switches':>10}")
    for r, s in summary.items():
        print(f"{r:<13}{s['cost_usd']:>9.4f}{s['mean_accuracy']:>10.4f}{s['cached_share']:>9.3f}{s['switches']:>10}")
    for t in results.get("cache_aware", {}).get("turns", []):
        if t["action"] == "switched" or t["kind"] == "hard" and t["turn"] in (4, 16, 28):
            print(f"  cache_aware turn {t['turn']} ({t['kind']}): {t['action']} → {t['model']}: {t['why']}")


if __name__ == "__main__":
    main()
