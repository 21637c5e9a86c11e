"""engine: openai against a real server no proxray code writes: vLLM's own OpenAI server (the CPU build, on a tiny
model, with --api-key) on 127.0.0.1, behind a fault-injecting proxy (tests/fault_proxy.py: 429s, 500s, dropped
connections, answers too slow, answers cut mid-way). The evaluation job evaluates it with vLLM's token counts, every
row once, the rate limit kept and the key in no output; the app passes requests through to it, streams its answer,
falls back on a 500 and ends a stream cut mid-way with an error event; the shipped mixed pool (a co-hosted vLLM model
beside it) is checked, evaluated, fitted, served and monitored with the shipped configs."""
import json
import os
import secrets
import subprocess
import sys
import time

import zlib

import pytest
import yaml

from conftest import ROOT
from fault_proxy import FaultProxy

from proxray.serve.front import free_port

pytestmark = pytest.mark.slow

NAME = "tiny-llama-b"  # the name vLLM serves it under
SIM = "meta-llama/Llama-3.3-70B-Instruct"


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    import httpx

    from proxray.devtools import build_tiny_model

    tmp = tmp_path_factory.mktemp("vllm-endpoint")
    model = build_tiny_model(tmp / NAME, seed=1)
    key = "sk-" + secrets.token_hex(16)
    old = os.umask(0o077)
    (tmp / "key").write_text(key + "\n")
    os.umask(old)
    port = free_port()
    log = open(tmp / "vllm.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", NAME,
         "--host", "127.0.0.1", "--port", str(port), "--api-key", key, "--dtype", "float32", "--enforce-eager",
         "--max-model-len", "512", "--max-num-seqs", "8",
         "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],  # tools, a forced choice decoded to its schema
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
        start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 300
    while True:
        try:
            if httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}, timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail("vllm's server did not start:\n" + (tmp / "vllm.log").read_text()[-3000:])
        time.sleep(2)
    yield url, key, str(tmp / "key"), tmp
    os.killpg(proc.pid, 15)
    proc.wait(60)


FAULTS = {0: "429", 1: "500", 2: "drop", 3: "cut", 4: "slow"}  # on a prompt's first try, by its hash (5: none)
SLOW_S, TIMEOUT_S = 3.0, 2.0  # a slow answer comes after the job's request timeout


def fault_of(prompt: str, tries: int = 1):
    return FAULTS.get(zlib.crc32(prompt.encode()) % 6) if tries == 1 else None


def prompt_of(kind: int, stem: str) -> str:
    """A prompt whose first try meets fault ``kind`` (5: none)."""
    return next(t for t in (f"{stem} (case {i})" for i in range(1000)) if zlib.crc32(t.encode()) % 6 == kind)


@pytest.fixture
def proxy(vllm_server):
    """A fault proxy for one test: every prompt meets its fault on its first try in that test."""
    p = FaultProxy(vllm_server[0], fault_of, slow_s=SLOW_S)
    yield p
    p.stop()


def spec(server, url=None, **kw):
    _, _, key_file, _ = server
    return {"id": NAME, "engine": "openai", "base_url": url or server[0], "api_key_file": key_file,
            "price": {"input_per_mtok": 0.02, "output_per_mtok": 0.04}, "num_cpus": 0.25, "batch_size": 8, **kw}


def test_the_job_evaluates_vllms_server_through_faults_every_row_once(vllm_server, proxy, local_ray):
    import json

    from proxray import RoutingTable
    from proxray.evaljob import JobConfig, run_job

    url, key, _, tmp = vllm_server
    cfg = JobConfig.model_validate({
        "query_sets": [{"name": "tiny", "path": str(ROOT / "jobs" / "data" / "tiny_queries.jsonl")}],
        "sampling": {"max_tokens": 16},
        "models": [spec(vllm_server, proxy.url, timeout_s=TIMEOUT_S, rate_limit={"requests_per_minute": 600}),
                   {"id": "meta-llama/Llama-3.3-70B-Instruct", "engine": "sim", "num_cpus": 0.25,
                    "price": {"input_per_mtok": 0.15, "output_per_mtok": 0.3}}]})
    res = run_job(cfg, tmp / "out")
    assert res["complete_queries"] == 40 and res["open_errors"] == 0
    rows = RoutingTable.read(tmp / "out" / "routing_table.parquet").df
    mine = rows[rows["model"] == NAME]
    assert len(mine) == 40 and mine["query_id"].is_unique and (mine["input_tokens"] > 0).all()
    assert ((mine["output_tokens"] >= 1) & (mine["output_tokens"] <= 16)).all()
    # every fault was met; each prompt reached vLLM once, twice where its first answer was cut or too slow
    prompts = [json.loads(line)["prompt"] for line in (ROOT / "jobs" / "data" / "tiny_queries.jsonl").open()]
    assert {f for _, _, f, _ in proxy.log} >= set(FAULTS.values())
    forwarded = proxy.forwarded()
    assert {p: forwarded[p] for p in prompts} == {p: 1 + (fault_of(p) in ("cut", "slow")) for p in prompts}
    # the limit (600 a minute: starts 0.1 s apart) held over every try, faulted ones included. The proxy stamps
    # arrivals in this process, beside the job's driver on 2 cores: a stamp can lag its send by ~0.1 s, so any 11
    # consecutive arrivals span >= 1.0 s less 0.25 s of that lag, and any 21 span >= 2.0 s less the same 0.25 s
    times = sorted(t for t, p, _, _ in proxy.log if p in prompts)
    span = lambda n: min(b - a for a, b in zip(times, times[n - 1:]))  # noqa: E731
    assert len(times) > 40 and span(11) >= 0.75 and span(21) >= 1.75, (span(11), span(21))
    for path in (tmp / "out").rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path


def serve_config(raw: dict) -> int:
    """Deploy a Serve config's app the way `proxray serve --config` does (Serve's own schema, the app's import path) on
    a free port of 127.0.0.1; returns the port."""
    import ray
    from ray import serve
    from ray.serve.schema import ServeDeploySchema

    from proxray.serve.app import build_app

    schema = ServeDeploySchema.model_validate(raw)
    port = free_port()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled"}})
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": 300})
    app = schema.applications[0]
    serve.run(build_app(app.args), name=app.name, route_prefix=app.route_prefix)
    return port


def test_the_shipped_mixed_pool_end_to_end(vllm_server, proxy, tmp_path, monkeypatch, capsys, local_ray):
    """jobs/configs/mixed_cpu.yaml, serve_configs/mixed_cpu.yaml and monitor_configs/mixed_cpu.yaml as their comments
    run them — the co-hosted model's folder, the external server (vLLM's, here behind the fault proxy on this test's
    port, with this test's key file) — through proxray check, build-table (the co-hosted model through ray.data.llm's
    vLLM, the external one through its server), fit, serve (ray.serve.llm beside the relay) and the monitor, which
    re-evaluates drifted traffic on the same pool and grows the router."""
    import ray
    from openai import APIError, OpenAI
    from ray import serve

    from proxray.cli import main
    from proxray.devtools import build_tiny_model
    from proxray.monitor import DriftMonitor
    from proxray.monitor.config import load_monitor_config
    from proxray.routing.registry import load_router

    url, key, key_file, _ = vllm_server
    monkeypatch.chdir(tmp_path)
    build_tiny_model(tmp_path / "out" / "tiny-llama-a", seed=0)

    def rewritten(name, folder, models_at):
        raw = yaml.safe_load((ROOT / folder / "mixed_cpu.yaml").read_text())
        external = next(m for m in models_at(raw) if m["engine"] == "openai")
        external.update(base_url=proxy.url, api_key_file=key_file)
        (tmp_path / name).write_text(yaml.safe_dump(raw))
        return raw, external

    job, external = rewritten("job.yaml", "jobs/configs", lambda r: r["models"])
    job["query_sets"][0]["path"] = str(ROOT / job["query_sets"][0]["path"])
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert main(["check", "--config", "job.yaml"]) == 0, capsys.readouterr().out
    assert main(["build-table", "--config", "job.yaml"]) == 0
    assert "40 complete queries × 3 models" in capsys.readouterr().err
    assert {f for _, _, f, _ in proxy.log} >= {"429", "500", "drop", "cut"}  # met, retried, no row lost
    assert main(["fit", "--table", "out/mixed_cpu/routing_table.parquet", "--router", "knn", "--k", "10",
                 "--out", "out/mixed_cpu/router"]) == 0
    monitor, _ = rewritten("monitor.yaml", "monitor_configs", lambda r: r["job"]["models"])
    app, _ = rewritten("serve.yaml", "serve_configs", lambda r: r["applications"][0]["args"]["models"])
    capsys.readouterr()
    for name in ("serve.yaml", "monitor.yaml"):
        assert main(["check", "--config", name]) == 0, capsys.readouterr().out
    external["api_key_file"] = str(tmp_path / "job.yaml")  # not its key
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert main(["check", "--config", "job.yaml"]) == 2
    assert "the key was refused (HTTP 401)" in capsys.readouterr().out

    # served: every model by name, and routed; a 500 before the first token is retried, a stream cut mid-way ends in
    # an error event
    ray.shutdown()  # the job's local Ray: the app starts its own
    try:
        port = serve_config(app)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=240)
        ask = (lambda model, text, **kw: client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": text}], max_tokens=12, temperature=0, seed=1, **kw))
        for m in ("tiny-llama-a", NAME, SIM):
            r = ask(m, prompt_of(5, "Count to three."))
            assert r.model == m and r.usage.completion_tokens >= 1 and r.model_extra["proxray"]["fallback_from"] == []
        full = ask(NAME, prompt_of(5, "Name a colour."))
        chunks = list(ask(NAME, prompt_of(5, "Name a colour."), stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content
        assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
        # routed among the external model and the 70B one, cheapest first: the external one, whose first answer is a
        # 500, tried again by the relay and answered there (no fallback), the 500 seen by the proxy
        text = prompt_of(1, "Tom has 3 boxes of 4 apples. How many apples?")
        routed = ask("proxray", text, extra_body={"proxray": {"allowed_models": [NAME, SIM], "lam": 1e9}})
        assert routed.model == NAME and routed.model_extra["proxray"]["fallback_from"] == []
        assert [f for _, p, f, _ in proxy.log if p == text] == ["500", None]
        # the Responses API: relayed to vLLM's own /v1/responses for the external model (responses_api: true),
        # continued by previous_response_id from the gateway's store, streamed; through chat for the co-hosted one
        first = client.responses.create(model=NAME, input=prompt_of(5, "Name a fruit."), max_output_tokens=12,
                                        temperature=0)
        assert first.model == NAME and first.usage.output_tokens >= 1 and first.status in ("completed", "incomplete")
        assert proxy.paths[prompt_of(5, "Name a fruit.")] == "/v1/responses"
        then = prompt_of(5, "And another fruit?")
        second = client.responses.create(model=NAME, input=then, previous_response_id=first.id, max_output_tokens=12)
        assert second.previous_response_id == first.id and proxy.paths[then] == "/v1/responses"
        assert client.responses.retrieve(second.id).output_text == second.output_text
        with client.responses.stream(model=NAME, input=prompt_of(5, "Name a tree."), max_output_tokens=12) as s:
            kinds = [e.type for e in s]
            final = s.get_final_response()
        assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
        assert final.model == NAME and final.usage.output_tokens >= 1
        cohosted = client.responses.create(model="tiny-llama-a", input="Count to three.", max_output_tokens=12)
        assert cohosted.model == "tiny-llama-a" and cohosted.usage.output_tokens >= 1
        # the Messages API (the anthropic SDK): relayed to vLLM's own /v1/messages for the external model
        # (messages_api: true), streamed and counted there, a forced tool call decoded by the tiny model
        from anthropic import Anthropic

        claude = Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="unused", max_retries=0, timeout=240)
        said = prompt_of(5, "Name a planet.")
        m = claude.messages.create(model=NAME, max_tokens=12, extra_body={"temperature": 0},
                                   messages=[{"role": "user", "content": said}])
        assert m.model == NAME and m.usage.output_tokens >= 1 and m.content[0].type == "text"
        assert m.model_extra["proxray"]["model"] == NAME and proxy.paths[said] == "/v1/messages"
        with claude.messages.stream(model=NAME, max_tokens=12, extra_body={"temperature": 0},
                                    messages=[{"role": "user", "content": said}]) as s:
            streamed = s.get_final_message()
        assert streamed.content[0].text == m.content[0].text and streamed.usage.output_tokens == m.usage.output_tokens
        counted = claude.messages.count_tokens(model=NAME, messages=[{"role": "user", "content": said}])
        assert counted.input_tokens >= 3 and "proxray" not in (counted.model_extra or {})  # vLLM's own count
        unit = {"name": "unit", "input_schema": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}},
                                                 "required": ["unit"]}}
        forced = {"tools": [unit], "tool_choice": {"type": "tool", "name": "unit"}, "max_tokens": 200,
                  "messages": [{"role": "user", "content": prompt_of(5, "Which unit?")}], "extra_body": {"temperature": 0}}
        called = claude.messages.create(model=NAME, **forced)  # vLLM's /v1/messages, the tiny model decoding the call
        print(json.dumps({"forced_tool_on_tiny_llama_b": [b.model_dump() for b in called.content]}))
        # the random tiny model, held to the tool's grammar, writes the call's start and then whitespace until
        # max_tokens: what is checked is that the call is relayed with its tools and its answer comes back whole
        shown = " ".join(getattr(b, "text", None) or getattr(b, "name", "") for b in called.content)
        assert called.stop_reason == "tool_use" or (called.stop_reason == "max_tokens" and '"name": "unit"' in shown)
        got = []
        with pytest.raises(APIError, match="mid-stream"):
            for c in ask(NAME, prompt_of(3, "Count to ten."), stream=True):
                got.append(c)
        assert got  # what came before the cut reached the client
    finally:
        serve.shutdown()
        ray.shutdown()

    # monitored: drifted traffic re-evaluated on the same mixed pool, the router grown
    from conftest import _start_local_ray

    _start_local_ray()
    mon = DriftMonitor(load_monitor_config("monitor.yaml").model_copy(update={"submit": "inline"}))
    router = mon.publisher.router
    new = [f"Translate into French, please: the garden by river number {i} is green." for i in range(12)]
    X = mon.encoder.encode(new)
    assert sum(mon.report(p, x, float(s)) for p, x, s in zip(new, X, router.outlier_score(X))) >= 8
    mon.tick()
    st = mon.status()
    (evaluation,) = [j for j in st["jobs"] if j["kind"] == "drift"]
    canaries = [k for k in mon.evaluations.items[0]["meta"] if k.startswith("canary-")]  # the judge's spot checks
    assert evaluation["status"] == "DONE" and evaluation["n"] == 8 + len(canaries) and st["router_version"] == 1
    v1 = mon.versions()[1]  # grown by the 8; a candidate, or kept rejected with why (the gate)
    assert v1["n_train"] == router.n_train_ + 8 and v1["status"] in ("candidate", "rejected") and v1["gate"]["why"]
    print("gate:", v1["status"], v1["gate"]["why"], json.dumps(st["label_sources"]))
    assert sum(proxy.forwarded().get(p, 0) >= 1 for p in new) == 8  # the external model answered what was evaluated
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert key.encode() not in path.read_bytes(), path
