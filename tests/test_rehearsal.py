"""The shipped GPU configs, rehearsed as the cluster guide's local form (tests/rehearsal.py, in a process of its own so
that its Ray keeps token auth on): the H100 job config evaluated through the Jobs API with --simulate, the router
fitted as the guide says, the shipped H100 / A100 Serve configs, the cluster monitor config and the KubeRay manifests'
configs passing proxray check (an encoder mismatch and an unknown model named), the H100 config answering routed
requests with --simulate on a local cluster that declares 16 H100s a node, and the cluster monitor config submitting
an evaluation of drifted traffic."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_the_shipped_gpu_configs_rehearsed_on_a_cpu():
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # the rehearsal's Ray keeps auth on
    script = Path(__file__).with_name("rehearsal.py")
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-6000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["job"] == "SUCCEEDED" and "ok, it would deploy" in seen["job_check"]
    assert len(seen["rayjob_router"]) == 14  # the RayJob's entrypoint fitted the router on the pool's table
    assert seen["checked"] == ["serve_configs/paper_pool_h100.yaml", "serve_configs/paper_pool_a100.yaml",
                               "monitor_configs/paper_pool_h100.yaml", "monitor_configs/paper_pool_a100.yaml"]
    assert seen["kuberay_checked"] and seen["mismatch_named"]
    assert seen["router_path"] == "s3://my-proxray-bucket/proxray/routers/paper_pool"
    assert seen["routed_model"] and seen["wrong_key"] == 401
    assert seen["replicas"] == 14 + 2  # every model of the config and two ingress replicas
    assert seen["gpus_in_use"] >= 16  # the models' GPUs at minimum scale: 4 x 0.5 + 8 + 2 + 4, on declared H100s
    assert seen["monitor_submitted"] and seen["jobs_api"] == [seen["monitor_submitted"]]
