"""engine: openai against a real server no proxray code writes: vLLM's own OpenAI server (the CPU build, on a tiny
model, with --api-key) on 127.0.0.1. The evaluation job evaluates it with vLLM's token counts and the key in no
output; the app passes requests through to it and streams its answer; the shipped mixed-pool example (a co-hosted
vLLM model beside it) passes proxray check. Faults are the stand-in's (test_openai_engine, test_endpoint_serve)."""
import os
import secrets
import socket
import subprocess
import sys
import time

import pytest
import yaml

from conftest import ROOT

pytestmark = pytest.mark.slow

NAME = "tiny-llama-b"  # the name vLLM serves it under


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
         "--max-model-len", "512", "--max-num-seqs", "8"],
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


def spec(server, **kw):
    url, _, key_file, _ = server
    return {"id": NAME, "engine": "openai", "base_url": url, "api_key_file": key_file,
            "price": {"input_per_mtok": 0.02, "output_per_mtok": 0.04}, "num_cpus": 0.25, "batch_size": 8, **kw}


def test_the_job_evaluates_vllms_server_with_its_token_counts(vllm_server, local_ray):
    from proxray import RoutingTable
    from proxray.evaljob import JobConfig, run_job

    url, key, _, tmp = vllm_server
    cfg = JobConfig.model_validate({
        "query_sets": [{"name": "tiny", "path": str(ROOT / "jobs" / "data" / "tiny_queries.jsonl")}],
        "sampling": {"max_tokens": 16},
        "models": [spec(vllm_server, rate_limit={"requests_per_minute": 6000}),
                   {"id": "meta-llama/Llama-3.3-70B-Instruct", "engine": "sim", "num_cpus": 0.25,
                    "price": {"input_per_mtok": 0.15, "output_per_mtok": 0.3}}]})
    res = run_job(cfg, tmp / "out")
    assert res["complete_queries"] == 40 and res["open_errors"] == 0
    rows = RoutingTable.read(tmp / "out" / "routing_table.parquet").df
    mine = rows[rows["model"] == NAME]
    assert len(mine) == 40 and (mine["input_tokens"] > 0).all()
    assert ((mine["output_tokens"] >= 1) & (mine["output_tokens"] <= 16)).all()
    for path in (tmp / "out").rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path


def test_the_shipped_mixed_pool_is_evaluated_fitted_and_checked(vllm_server, tmp_path, monkeypatch, capsys, local_ray):
    """jobs/configs/mixed_cpu.yaml and serve_configs/mixed_cpu.yaml as their comments run them: the co-hosted model's
    folder, the external server (here on this test's port, with this test's key file), proxray check, build-table
    (the co-hosted model through ray.data.llm's vLLM, the external one through its server), fit, and check the app."""
    from proxray.cli import main
    from proxray.devtools import build_tiny_model

    url, _, key_file, _ = vllm_server
    monkeypatch.chdir(tmp_path)
    build_tiny_model(tmp_path / "out" / "tiny-llama-a", seed=0)
    raw = yaml.safe_load((ROOT / "jobs" / "configs" / "mixed_cpu.yaml").read_text())
    external = next(m for m in raw["models"] if m["engine"] == "openai")
    external.update(base_url=url, api_key_file=key_file)
    raw["query_sets"][0]["path"] = str(ROOT / raw["query_sets"][0]["path"])
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(raw))
    assert main(["check", "--config", str(tmp_path / "job.yaml")]) == 0, capsys.readouterr().out
    assert main(["build-table", "--config", str(tmp_path / "job.yaml")]) == 0
    assert "40 complete queries × 3 models" in capsys.readouterr().err
    assert main(["fit", "--table", "out/mixed_cpu/routing_table.parquet", "--router", "knn", "--k", "10",
                 "--out", "out/mixed_cpu/router"]) == 0
    app = yaml.safe_load((ROOT / "serve_configs" / "mixed_cpu.yaml").read_text())
    served = next(m for m in app["applications"][0]["args"]["models"] if m["engine"] == "openai")
    served.update(base_url=url, api_key_file=key_file)
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(app))
    capsys.readouterr()
    assert main(["check", "--config", str(tmp_path / "serve.yaml")]) == 0, capsys.readouterr().out
    external["api_key_file"] = str(tmp_path / "job.yaml")  # not its key
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(raw))
    assert main(["check", "--config", str(tmp_path / "job.yaml")]) == 2
    assert "the key was refused (HTTP 401)" in capsys.readouterr().out


def test_the_app_passes_through_and_streams_vllms_answer(vllm_server, tmp_path, encoder):
    import ray
    from openai import OpenAI
    from serve_helpers import start_app, stop_app

    ray.shutdown()  # the job tests' local Ray: the app starts its own
    url = start_app(tmp_path, encoder, [spec(vllm_server), {"id": "meta-llama/Llama-3.3-70B-Instruct", "engine": "sim"}],
                    profile={NAME: (0.95, 1e-7)})
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        full = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Count to three."}],
                                              max_tokens=12, temperature=0, seed=1)
        assert full.model == NAME and full.usage.completion_tokens >= 1 and full.usage.prompt_tokens > 0
        chunks = list(client.chat.completions.create(
            model="proxray", messages=[{"role": "user", "content": "Count to three."}], max_tokens=12, temperature=0,
            seed=1, stream=True, stream_options={"include_usage": True}))
        assert chunks[0].model_extra["proxray"]["model"] == NAME
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == full.choices[0].message.content  # greedy: the stream is the answer, piece by piece
        assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    finally:
        stop_app()
