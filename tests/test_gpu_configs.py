"""The GPU counts the shipped GPU configs state in their comments are the ones they ask for (derived here from the
configs, as `proxray check` derives them), and cluster.yaml can start the nodes the journey needs at its peak:
the served models at minimum scale plus one evaluation of the drift monitor."""
import math
import re
from pathlib import Path

import pytest
import yaml

from proxray.check import _job_demand, _served_demand

ROOT = Path(__file__).resolve().parents[1]
GPU_CONFIGS = sorted([*ROOT.glob("serve_configs/paper_pool_*.yaml"), *ROOT.glob("jobs/configs/paper_pool_*.yaml"),
                      *ROOT.glob("monitor_configs/paper_pool_*.yaml")])
SUM = re.compile(r"((?:\d+(?:\.\d+)? x )?\d+(?:\.\d+)?(?: \+ (?:\d+(?:\.\d+)? x )?\d+(?:\.\d+)?)*) = "
                 r"(\d+(?:\.\d+)?) ([AHV]100)s")
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5}
NODE = {"H100": "h100_worker", "A100": "a100_worker"}


def demand(path: Path) -> dict:
    """GPUs by accelerator type: a Serve config's models at minimum scale, a job's (or a monitor's evaluation's)
    every replica at once."""
    from proxray.pool.spec import PoolModel
    from proxray.serve.config import AppArgs

    raw = yaml.safe_load(path.read_text())
    if "applications" in raw:
        rows = [_served_demand(m) for m in AppArgs.model_validate(raw["applications"][0]["args"]).models]
    else:
        rows = _job_demand([PoolModel.model_validate(m) for m in (raw["job"] if "job" in raw else raw)["models"]])
    out = {}
    for _, kind, gpus in rows:
        out[kind] = out.get(kind, 0) + gpus
    return out


def header(path: Path) -> str:
    return "\n".join(line[1:] for line in path.read_text().splitlines() if line.startswith("#")).replace("\n", " ")


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_stated_gpu_count_is_the_configs(path):
    text = header(path)
    found = SUM.findall(text)
    assert found, f"{path.name}: no 'a x b + c = N <GPU>s' count in its comments"
    expr, total, kind = found[0]
    assert math.isclose(eval(expr.replace(" x ", "*")), float(total)), f"{expr} is not {total}"  # noqa: S307
    assert demand(path) == {kind: float(total)}
    for m in re.finditer(r"so (two|three|four|five) \S+ nodes", text):  # 8 GPUs a node
        assert WORDS[m.group(1)] == math.ceil(float(total) / 8), m.group(0)
    declared = re.search(r"--num-gpus (\d+)", text)
    if declared:  # the rehearsal's local cluster declares enough GPUs of the type
        assert int(declared.group(1)) >= float(total)
        assert re.search(rf'"accelerator_type:{kind}": (\d+)', text).group(1) == declared.group(1)


def test_cluster_yaml_starts_the_nodes_of_serving_plus_an_evaluation():
    c = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    types = c["available_node_types"]
    for kind in ("H100", "A100"):
        t = kind.lower()
        serve = demand(ROOT / "serve_configs" / f"paper_pool_{t}.yaml")[kind]
        evaluation = demand(ROOT / "monitor_configs" / f"paper_pool_{t}.yaml")[kind]
        assert demand(ROOT / "jobs" / "configs" / f"paper_pool_{t}.yaml")[kind] == evaluation
        node = types[NODE[kind]]
        per_node = node["resources"][f"accelerator_type:{kind}"]
        assert node["max_workers"] >= math.ceil(serve / per_node) + math.ceil(evaluation / per_node), kind
    assert "v100_worker" not in types  # the image's CUDA 13 PyTorch and vLLM have no Volta kernels
