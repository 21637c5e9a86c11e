import pytest
import yaml

from conftest import ROOT
from proxray.serve.schemas import AppArgs


@pytest.mark.parametrize("name", ["cpu_demo", "paper_pool_h100", "paper_pool_v100"])
def test_serve_configs_are_valid(name):
    from ray.serve.schema import ServeDeploySchema

    raw = yaml.safe_load((ROOT / "serve_configs" / f"{name}.yaml").read_text())
    ServeDeploySchema.model_validate(raw) if hasattr(ServeDeploySchema, "model_validate") else ServeDeploySchema.parse_obj(raw)
    app = raw["applications"][0]
    assert app["import_path"] == "proxray.serve.app:build_app"
    args = AppArgs.model_validate(app["args"])
    if name != "cpu_demo":
        assert len(args.models) == 14 and all(m.engine == "vllm" for m in args.models)
        acc = "H100" if "h100" in name else "V100"
        assert {m.accelerator_type for m in args.models} == {acc}
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
    assert {"v100_worker", "h100_worker"} <= set(types)
