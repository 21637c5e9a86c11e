"""docs/guides/deploy-on-a-cluster.md against the files it names: every path exists, the commands it gives match
the ones the files carry, the quota it asks for is what serving and the monitor's evaluations take on the node
types cluster.yaml starts, and the Kubernetes steps come in an order that works (the router before the service)."""
import math
import re
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_gpu_configs import demand  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "guides" / "deploy-on-a-cluster.md").read_text()
VCPUS = {"p5.48xlarge": 192, "p4de.24xlarge": 96}


def test_every_file_the_guide_names_exists():
    named = set(re.findall(r"\]\(\.\./\.\./([^)#]+)\)", GUIDE))
    named |= {p for p in re.findall(r"`((?:jobs|serve_configs|monitor_configs|deploy)/[\w./-]+\.(?:yaml|py))`", GUIDE)}
    named |= set(re.findall(r"--config ((?:jobs/configs|serve_configs|monitor_configs)/\S+\.yaml)", GUIDE))
    assert len(named) > 8
    assert [p for p in sorted(named) if not (ROOT / p).exists()] == []


def test_the_hugging_face_login_is_the_installed_clis():
    assert "hf auth login" in GUIDE and "huggingface-cli" not in GUIDE + (ROOT / "cluster.yaml").read_text()
    hf = Path(sys.executable).with_name("hf")
    r = subprocess.run([str(hf), "auth", "login", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "token" in r.stdout.lower()


def test_the_quota_is_serving_plus_an_evaluation_on_cluster_yamls_node_types():
    c = yaml.safe_load((ROOT / "cluster.yaml").read_text())["available_node_types"]
    for kind, node in (("H100", "h100_worker"), ("A100", "a100_worker")):
        t = kind.lower()
        per_node = c[node]["resources"][f"accelerator_type:{kind}"]
        nodes = math.ceil(demand(ROOT / "serve_configs" / f"paper_pool_{t}.yaml")[kind] / per_node) + \
            math.ceil(demand(ROOT / "monitor_configs" / f"paper_pool_{t}.yaml")[kind] / per_node)
        vcpus = nodes * VCPUS[c[node]["node_config"]["InstanceType"]]
        assert re.search(rf"{kind} \*\*{vcpus}( vCPUs)?\*\*", GUIDE), (kind, vcpus)
    assert "v100_worker" not in c and "V100 **" not in GUIDE  # no V100 node type: CUDA 13 has no Volta


def test_the_guide_says_what_each_journey_costs_and_takes_on_its_first_screen():
    aws = GUIDE[:GUIDE.index("## 0. Prerequisites")]
    k8s = GUIDE[GUIDE.index("## On Kubernetes (KubeRay)"):]
    k8s = k8s[:k8s.index("**Prerequisites**")]
    for first in (aws, k8s):
        assert "**What it costs and how long it takes**" in first and "per hour" in first and "takes" in first
        assert "p5.48xlarge" in first and "2026-12-01" in first  # list prices, dated


def test_the_kubernetes_steps_fit_the_router_before_the_service_starts():
    k8s = GUIDE[GUIDE.index("## On Kubernetes (KubeRay)"):]
    order = [k8s.index(s) for s in ("docker build -f deploy/Dockerfile", "kubectl create secret generic "
                                    "proxray-api-key", "kubectl apply -f deploy/kuberay/rayjob.yaml",
                                    "kubectl wait --for=jsonpath='{.status.jobStatus}'=SUCCEEDED rayjob/proxray-tables",
                                    "kubectl apply -f deploy/kuberay/rayservice.yaml")]
    assert order == sorted(order)
    job = yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayjob.yaml").read_text())
    assert job["metadata"]["name"] == "proxray-tables"
    docker = (ROOT / "deploy" / "Dockerfile").read_text()
    build = re.search(r"docker build .*", k8s).group(0)
    assert build in docker  # the guide's build command is the Dockerfile's
    # the secrets the guide creates are the ones the manifests mount, with the keys they read
    for name in ("rayjob.yaml", "rayservice.yaml"):
        text = (ROOT / "deploy" / "kuberay" / name).read_text()
        for secret, key in (("proxray-api-key", "api_key"), ("hf-token", "token")):
            assert f"secretName: {secret}" in text and f"kubectl create secret generic {secret} --from-file={key}=" in k8s


def test_the_monitor_commands_work_as_written():
    """`ray exec cluster.yaml 'proxray monitor status'` runs in a shell that sources ~/.bashrc, which cluster.yaml
    makes export RAY_AUTH_MODE=token (run on a cluster in tests/test_monitor_on_a_cluster.py)."""
    assert "ray exec cluster.yaml 'proxray monitor status'" in GUIDE
    setup = yaml.safe_load((ROOT / "cluster.yaml").read_text())["setup_commands"]
    assert any("export RAY_AUTH_MODE=token" in c and "~/.bashrc" in c for c in setup)
