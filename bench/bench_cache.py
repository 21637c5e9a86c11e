"""The response cache measured: its semantic tier's false and true hits on the shipped routing tables, and (``--http``)
what a hit costs and saves on a replayed trace.

    python bench/bench_cache.py [--json out.json] [--http [--bounds 10000]] [--data ../shared/data]

**False hits** (offline): every distinct question of the shipped tables (``../shared/data``: RouterBench's slice,
RouterDC's, BBH's) in one scope, embedded with the routing encoder (the shipped MiniLM); a question is a false hit at
a threshold where the nearest *other* question (another ``text_key``: it differs beyond case, runs of spaces and
sentence-ending punctuation) reaches it — it would have been answered with that question's cached answer (the
embedding tier, ``similarity``). Questions that share a ``text_key`` while written differently are listed apart: the
text tier, on by default, serves them from each other's cache.
**True hits**: rule-made paraphrases of 1,000 of those questions (seeded) — lower case, punctuation dropped, whitespace
doubled, the first sentence moved to the end — answered from the cache at each threshold (the text tier or the
embedding's).

**Over HTTP** (``--http``): the CPU demo's app (sim models, their prices) on a local Ray and Serve with the cache on; a
trace of the tables' questions with repeats and paraphrases (each question once, then a third of them again as sent,
then a sixth paraphrased), sent one at a time: p50/p95 ms of a miss, an exact hit and a semantic hit; with the cache
off (``proxray: {cache: false}``), of new questions (what a miss is compared with: both embed a new text) and of the
trace's questions asked again (what an exact hit is compared with: both find the text's embedding in the replica's
cache); the hit rate and the USD the hits saved. ``--bounds 10000``: then 10,000 distinct requests of one key against
a cache of 2,000 answers (a scope's share: 500), after another key's 20 answers: the entries held, the largest
scope's, and whether the other key's answers are still exact hits.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # the benchmark's own local cluster

THRESHOLDS = (0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995)
TABLES = ("routerbench_slice.parquet", "routerdc7.parquet", "bbh19_dev.parquet")


def questions(data: Path) -> list[str]:
    import pandas as pd

    seen: dict = {}
    for name in TABLES:
        for q in pd.read_parquet(data / name, columns=["prompt"])["prompt"].astype(str):
            seen.setdefault(q, None)
    return list(seen)


def paraphrases(q: str) -> dict:
    """The rule-made paraphrases of ``q`` (a rule that changes nothing is left out)."""
    out = {"lower case": q.lower(), "no sentence punctuation": re.sub(r"[?.!,;:]+(?=\s|$)", "", q),
           "whitespace": re.sub(r" ", "  ", q.strip()) + "\n"}
    parts = re.split(r"(?<=[.?!])\s+|\n+", q.strip())
    if len(parts) >= 2:
        out["preamble moved"] = " ".join(parts[1:] + parts[:1])
    return {k: v for k, v in out.items() if v != q}


def embed(texts: list[str], cache: Path | None) -> np.ndarray:
    from proxray import SentenceEncoder

    if cache is not None and cache.exists():
        X = np.load(cache)
        if len(X) == len(texts):
            return X
    t0 = time.perf_counter()
    X = SentenceEncoder().encode(texts).astype(np.float32)
    print(f"embedded {len(texts)} texts in {time.perf_counter() - t0:.0f} s", flush=True)
    if cache is not None:
        np.save(cache, X)
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def offline(data: Path, cache_dir: Path | None, seed: int = 0) -> dict:
    import faiss

    from proxray.serve.request.cache import text_key

    qs = questions(data)
    keys = [text_key(q) for q in qs]
    X = embed(qs, cache_dir / "questions.npy" if cache_dir else None)
    X = X / np.linalg.norm(X, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(X.shape[1])
    index.add(X)
    sims, ids = index.search(X, 8)
    nearest_other = np.zeros(len(qs), dtype=np.float32)
    for i in range(len(qs)):  # the nearest question that is another ask (another text_key)
        nearest_other[i] = next((s for s, j in zip(sims[i], ids[i]) if j != i and keys[j] != keys[i]), -1.0)
    groups: dict = {}
    for k in keys:
        groups[k] = groups.get(k, 0) + 1
    shared = [k for k, n in groups.items() if n > 1]
    out = {"questions": len(qs), "text_key_collisions": int(sum(groups[k] - 1 for k in shared)),
           "text_key_examples": [[q[:200] for q in qs if text_key(q) == k] for k in shared[:10]],
           "false_hits": {str(t): int((nearest_other >= t).sum()) for t in THRESHOLDS},
           "false_hit_examples": []}
    for i in np.argsort(-nearest_other)[:5]:
        j = next(j for s, j in zip(sims[i], ids[i]) if j != i and keys[j] != keys[i])
        out["false_hit_examples"].append({"similarity": round(float(nearest_other[i]), 4), "a": qs[i][:160],
                                          "b": qs[j][:160]})
    rng = np.random.default_rng(seed)
    sample = rng.choice(len(qs), size=min(1000, len(qs)), replace=False)
    rows = [(int(i), rule, text) for i in sample for rule, text in paraphrases(qs[int(i)]).items()]
    P = embed([t for _, _, t in rows], None)
    P = P / np.linalg.norm(P, axis=1, keepdims=True)
    true = {}
    for rule in sorted({r for _, r, _ in rows}):
        idx = [n for n, (_, r, _) in enumerate(rows) if r == rule]
        same_text = np.array([text_key(rows[n][2]) == keys[rows[n][0]] for n in idx])
        sim = np.array([float(P[n] @ X[rows[n][0]]) for n in idx])
        true[rule] = {"paraphrases": len(idx), "text_tier": round(float(same_text.mean()), 4),
                      **{str(t): round(float((same_text | (sim >= t)).mean()), 4) for t in THRESHOLDS}}
    out["true_hits"] = true
    return out


def over_http(data: Path, n: int = 150, seed: int = 0, bounds: int = 0) -> dict:
    """The trace over HTTP on a local app (see the module's docstring); ``bounds``: then that many distinct requests
    of one key, against a cache of 2,000 answers (a scope's share 500), and another key's answers kept."""
    import tempfile

    import httpx
    import ray
    from ray import serve

    from proxray.serve.app import build
    from proxray.serve.front import free_port, front_env

    os.environ.update(front_env(local=True))
    rng = np.random.default_rng(seed)
    qs = [q for q in questions(data) if 20 < len(q) < 400]
    chosen = [qs[int(i)] for i in rng.choice(len(qs), size=n + n // 3, replace=False)]
    picked, fresh = chosen[:n], chosen[n:]  # the trace's questions; others, asked with the cache off
    models = [("meta-llama/Llama-3.2-1B-Instruct", 0.1, 0.2), ("meta-llama/Llama-3.3-70B-Instruct", 3.0, 15.0)]
    tmp = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    from proxray import SentenceEncoder

    fit_router(tmp / "router", SentenceEncoder(), [m for m, _, _ in models])
    port = free_port()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    one = {"min_replicas": 1, "max_replicas": 1}
    from proxray.serve.tenancy.keys import new_key_entry

    keys = {name: new_key_entry(tmp / "keys.yaml", name) for name in ("trace", "busy", "other")}
    cache = {"max_entries": 2000, "scope_share": 0.25}
    serve.run(build({"router": str(tmp / "router"), "keys_file": str(tmp / "keys.yaml"), "response_cache": cache,
                     "models": [
        {"id": m, "engine": "sim", "autoscaling": one, "price": {"input_per_mtok": i, "output_per_mtok": o}}
        for m, i, o in models]}), name="proxray", route_prefix="/")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    client = httpx.Client(timeout=60)
    for _ in range(100):  # the routes answer
        if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
            break
        time.sleep(0.2)

    def ask(text, cache=True, key="trace"):
        body = {"model": "proxray", "temperature": 0, "max_tokens": 32, "messages": [{"role": "user", "content": text}]}
        if not cache:
            body["proxray"] = {"cache": False}
        t0 = time.perf_counter()
        r = client.post(url, json=body, headers={"Authorization": f"Bearer {keys[key]}"})
        ms = 1e3 * (time.perf_counter() - t0)
        r.raise_for_status()
        return ms, r.json()["proxray"].get("cache", {})

    trace = [(q, True) for q in picked] + [(q, True) for q in picked[: n // 3]] + \
        [(next(iter(paraphrases(q).values()), q), True) for q in picked[n // 3: n // 3 + n // 6]]
    times: dict = {"miss": [], "exact": [], "semantic": [], "off, new": [], "off, repeated": []}
    saved = 0.0
    for text, _ in trace:
        ms, rep = ask(text)
        times.setdefault(rep.get("kind", "off"), []).append(ms)
        saved += rep.get("saved_usd") or 0.0
    for q in fresh:  # new questions with the cache off: what a miss is compared with
        times["off, new"].append(ask(q, cache=False)[0])
    for q in picked[: n // 3]:  # the same requests again with the cache off: what an exact hit is compared with
        times["off, repeated"].append(ask(q, cache=False)[0])
    # what the store's lookup costs the replica: one actor call, against the same lookup in the caller's process
    from proxray.serve.tenancy.response_cache import CacheStore

    actor = ray.get_actor("proxray-cache-proxray", namespace="proxray")
    vec = np.ones(384, dtype=np.float32)
    calls = []
    for i in range(300):
        t0 = time.perf_counter()
        ray.get(actor.get.remote("scope", f"absent-{i}", "c", vec, 0.99, "t"))
        calls.append(1e3 * (time.perf_counter() - t0))
    local, store = [], CacheStore()
    for i in range(300):
        t0 = time.perf_counter()
        store.get("scope", f"absent-{i}", "c", vec, 0.99, "t")
        local.append(1e3 * (time.perf_counter() - t0))
    lookup = {"actor_call_p50_ms": round(float(np.percentile(calls, 50)), 3),
              "actor_call_p95_ms": round(float(np.percentile(calls, 95)), 3),
              "in_process_p50_ms": round(float(np.percentile(local, 50)), 4)}
    held = {}
    if bounds:
        kept = picked[:20]
        for q in kept:
            ask(q, key="other")
        t0, last = time.perf_counter(), []
        for i in range(bounds):
            ms, _ = ask(f"Request {i} of a key that never repeats itself: {qs[i % len(qs)][:200]}", key="busy")
            if i >= bounds - 200:
                last.append(ms)
            if i and i % 1000 == 0:
                print(f"bounds: {i}/{bounds} requests, {time.perf_counter() - t0:.0f} s", flush=True)
        rep = ray.get(ray.get_actor("proxray-cache-proxray", namespace="proxray").report.remote())
        again = [ask(q, key="other")[1].get("kind") for q in kept]
        held = {"requests": bounds, "entries": rep["entries"], "bytes": rep["bytes"], "evicted": rep["evicted"],
                "largest_scope_entries": max(s["entries"] for s in rep["scopes"].values()),
                "other_key_exact_hits": f"{again.count('exact')}/{len(kept)}",
                "last_200_p50_ms": round(float(np.percentile(last, 50)), 2)}
    serve.shutdown()
    ray.shutdown()
    pct = {k: {"n": len(v), "p50_ms": round(float(np.percentile(v, 50)), 2), "p95_ms": round(float(np.percentile(v, 95)), 2)}
           for k, v in times.items() if v}
    hits = sum(len(times[k]) for k in ("exact", "semantic"))
    return {"requests": len(trace), "latency": pct, "hit_rate": round(hits / len(trace), 4),
            "saved_usd": round(saved, 6), "lookup": lookup, **({"bounds": held} if held else {})}


def fit_router(path: Path, encoder, models: list[str]) -> None:
    """A kNN router over the embedded default table, restricted to ``models``."""
    from proxray import KNNRouter
    from proxray.pool.simulated import make_table

    table = make_table(8)
    KNNRouter(k=10).fit(encoder.encode(table.prompts), *table.matrices(models=models), models=models,
                        encoder_id=encoder.id).save(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "data")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--cache-dir", type=Path, help="keep the questions' embeddings here between runs")
    p.add_argument("--http", action="store_true", help="also the trace over HTTP on a local app")
    p.add_argument("--http-only", action="store_true", help="the trace alone (the offline figures kept from --json)")
    p.add_argument("--bounds", type=int, default=0, help="then this many distinct requests of one key (10000)")
    a = p.parse_args(argv)
    if a.cache_dir:
        a.cache_dir.mkdir(parents=True, exist_ok=True)
    out = json.loads(a.json.read_text()) if a.http_only and a.json and a.json.exists() else {}
    if not a.http_only:
        out["offline"] = offline(a.data, a.cache_dir)
    if a.http or a.http_only:
        out["http"] = over_http(a.data, bounds=a.bounds)
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
