import pytest
import yaml

from conftest import ROOT
from proxray.serve.config import AppArgs


# each model's own context (max_position_embeddings): vLLM refuses a larger max_model_len
CONTEXT = {"Qwen/Qwen2-1.5B-Instruct": 32768, "Qwen/Qwen2-7B-Instruct": 32768,
           "deepseek-ai/deepseek-math-7b-instruct": 4096, "google/gemma-2b-it": 8192, "google/gemma-7b-it": 8192,
           "microsoft/Phi-3-mini-4k-instruct": 4096, "meta-llama/Llama-2-7b-chat-hf": 4096,
           "meta-llama/Llama-2-13b-chat-hf": 4096, "meta-llama/Llama-3.2-1B-Instruct": 131072,
           "meta-llama/Llama-3.2-3B-Instruct": 131072, "meta-llama/Llama-3.1-8B-Instruct": 131072,
           "meta-llama/Llama-3.3-70B-Instruct": 131072, "mistralai/Mistral-7B-Instruct-v0.3": 32768,
           "mistralai/Mixtral-8x7B-Instruct-v0.1": 32768}


@pytest.mark.parametrize("name", ["cpu_demo", "cpu_vllm", "paper_pool_h100", "paper_pool_a100"])
def test_serve_configs_are_valid(name):
    from ray.serve.schema import ServeDeploySchema

    raw = yaml.safe_load((ROOT / "serve_configs" / f"{name}.yaml").read_text())
    ServeDeploySchema.model_validate(raw) if hasattr(ServeDeploySchema, "model_validate") else ServeDeploySchema.parse_obj(raw)
    app = raw["applications"][0]
    assert app["import_path"] == "proxray.serve.app:build_app"
    args = AppArgs.model_validate(app["args"])
    if name.startswith("paper_pool"):
        assert len(args.models) == 14 and all(m.engine == "vllm" for m in args.models)
        acc = "H100" if "h100" in name else "A100"
        assert {m.accelerator_type for m in args.models} == {acc}
        # models vLLM 0.29 loads (not Phi-3-small), contexts within each model's own, no fp16-only V100 leftovers
        assert set(CONTEXT) == {m.id for m in args.models}
        assert all(m.engine_kwargs.get("max_model_len", 0) <= CONTEXT[m.id] for m in args.models)
        assert all("dtype" not in m.engine_kwargs for m in args.models)
        tp = {m.id: m.engine_kwargs.get("tensor_parallel_size", 1) for m in args.models}
        assert tp["meta-llama/Llama-3.3-70B-Instruct"] >= 4


def test_bad_app_args_are_named():
    with pytest.raises(Exception, match="autoscaling.max_replica"):
        AppArgs.model_validate({"router": "r", "models": [{"id": "a", "engine": "sim", "autoscaling": {"max_replica": 2}}]})
    with pytest.raises(Exception, match="ids must be unique"):
        AppArgs.model_validate({"router": "r", "models": [{"id": "a", "engine": "sim"}, {"id": "a", "engine": "sim"}]})


def test_cluster_yaml_has_cpu_head_and_gpu_workers():
    c = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    types = c["available_node_types"]
    assert types[c["head_node_type"]]["resources"] == {"CPU": 0}
    assert {"a100_worker", "h100_worker"} <= set(types) and "v100_worker" not in types  # CUDA 13 has no Volta
    # every node runs the one image (proxray, Ray and vLLM from install.sh gpu in one environment): nothing installed
    # on the nodes, no repository copied to them
    assert c["docker"]["image"] == "REGISTRY/proxray:gpu" and not any("install.sh" in cmd for cmd in c["setup_commands"])
    assert "rsync_exclude" not in c and not any(local in (".", "./") for local in c["file_mounts"].values())
    # a missing Hugging Face token (no gated model) does not stop Ray from starting
    starts = c["head_start_ray_commands"] + c["worker_start_ray_commands"]
    assert not any("huggingface/token" in cmd and "ray start" in cmd for cmd in starts)
    assert all("|| true" in cmd for cmd in starts if "huggingface/token" in cmd)


def test_cluster_yaml_keeps_ray_auth_on_and_the_dashboard_private():
    """Tests and CI may switch Ray's token auth off for their own local cluster; the shipped cluster may not."""
    text = (ROOT / "cluster.yaml").read_text()
    c = yaml.safe_load(text)
    starts = c["head_start_ray_commands"] + c["worker_start_ray_commands"]
    assert "disabled" not in text and "0.0.0.0" not in text
    assert all("RAY_AUTH_MODE=token" in cmd for cmd in starts if "ray start" in cmd)
    assert any("--dashboard-host=127.0.0.1" in cmd for cmd in c["head_start_ray_commands"])
    assert c["file_mounts"]["/home/ray/.ray/auth_token"] == "~/.ray/auth_token"  # the same token on every node


def test_nothing_shipped_switches_ray_auth_off_or_opens_the_dashboard():
    """Only the test command (tests and CI, their own local cluster) may disable auth; not the configs, the
    docs, the CLI, the monitor's Jobs client or the demo. The endpoint's key travels as a file, not runtime_env."""
    shipped = [ROOT / "cluster.yaml", *(ROOT / "serve_configs").glob("*.yaml"), *(ROOT / "jobs" / "configs").glob("*"),
               *(p for p in (ROOT / "docs").rglob("*") if p.is_file() and p.suffix != ".png"),  # figures are PNG
               *(ROOT / "proxray").rglob("*.py")]
    readme = (ROOT / "README.md").read_text()
    tests_run = "RAY_AUTH_MODE=disabled .venv/bin/python -m pytest"  # the test commands: the whole suite, the fast tier
    assert tests_run in readme.split("```bash")[2].split("```")[0]
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in shipped} | {"README.md": readme.replace(tests_run, "")}
    offenders = [name for name, t in texts.items() if "RAY_AUTH_MODE=disabled" in t or '"RAY_AUTH_MODE": "disabled"' in t
                 or "dashboard-host=0.0.0.0" in t]
    assert offenders == []
    c = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    for name in ("paper_pool_h100.yaml", "paper_pool_a100.yaml"):
        args = yaml.safe_load((ROOT / "serve_configs" / name).read_text())["applications"][0]["args"]
        node_path = args["api_key_file"].replace("~", "/home/ray", 1)  # the image's user, in the container
        assert any(node_path == m or node_path.startswith(m + "/") for m in c["file_mounts"]), node_path
        assert "api_key_env" not in args
        assert "runtime_env" not in args and "PROXRAY_API_KEY" not in (ROOT / "serve_configs" / name).read_text()


def test_cpu_vllm_config_is_cpu_only_in_its_config():
    """The CPU build of a vLLM model differs from a GPU one only in its config."""
    raw = yaml.safe_load((ROOT / "serve_configs" / "cpu_vllm.yaml").read_text())
    args = AppArgs.model_validate(raw["applications"][0]["args"])
    v = [m for m in args.models if m.engine == "vllm"]
    assert v and all(m.accelerator_type is None and m.engine_kwargs["dtype"] == "float32" for m in v)
    assert all(b == {"CPU": 0.1} for m in v for b in m.placement_group_config["bundles"])
    assert {m.engine for m in args.models} == {"vllm", "transformers", "sim"}


def test_cluster_yaml_names_the_bucket_and_the_role_and_keeps_secrets_in_files():
    """What a user fills in is named (the bucket, an instance profile on every node type); the job writes its table
    to the bucket and the router lives there; the Hugging Face token is a file mount, never an env var or argument."""
    text = (ROOT / "cluster.yaml").read_text()
    c = yaml.safe_load(text)
    assert all("IamInstanceProfile" in t["node_config"] for t in c["available_node_types"].values())
    assert "--out s3://my-proxray-bucket/proxray/tables" in text and "--out s3://my-proxray-bucket/proxray/routers/" in text
    assert c["file_mounts"]["/home/ray/.cache/huggingface/token"] == "~/.cache/huggingface/token"
    assert "HF_TOKEN" not in text and "runtime_env" not in text.split("cluster_name:")[1]
    # ~/.proxray (the endpoint's key, external endpoints' key files, env for api_key_env) on every node, owner-only,
    # its env loaded into `ray start`'s environment (the raylets', so every worker's and replica's)
    assert c["file_mounts"]["/home/ray/.proxray"] == "~/.proxray"
    for cmds in (c["head_start_ray_commands"], c["worker_start_ray_commands"]):
        assert any("chmod 700 ~/.proxray" in cmd and "-exec chmod 600" in cmd for cmd in cmds)
        start = [cmd for cmd in cmds if "ray start" in cmd]
        assert len(start) == 1 and start[0].startswith("if [ -f ~/.proxray/env ]; then set -a; . ~/.proxray/env;")
    for cmd in ("ray job status", "ray job logs", "serve status", "ray down"):
        assert cmd in text
