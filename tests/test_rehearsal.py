"""The shipped GPU configs, rehearsed as the cluster guide's local form (tests/rehearsal.py, in a process of its own so
that its Ray keeps token auth on): the H100 job config evaluated through the Jobs API with --simulate, the router
fitted as the guide says, the shipped H100 / A100 Serve configs, the cluster monitor config and the KubeRay manifests'
configs passing proxray check (an encoder mismatch and an unknown model named), the H100 config answering routed
requests with --simulate, and the cluster monitor config submitting an evaluation of drifted traffic — on cluster.yaml's
node types under Ray's own autoscaler (the fake multi-node provider), whose GPU workers start from zero as the job and
the app ask for them."""
import json
import os
import sys
from pathlib import Path

import pytest

import background

pytestmark = pytest.mark.slow


def _rehearsal(folder):
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # the rehearsal's Ray keeps auth on
    return [[sys.executable, Path(__file__).with_name("rehearsal.py")]], background.isolated_env("rehearsal", env), \
        folder


# a process of its own, with a Ray of its own: it runs in the background beside the modules from the OpenAI engine's
# on (the unit tests, the user's paths), which leave a core idle much of their time and come after every quiet module
# (tests/conftest.py), and this module runs last (LAST there); beside the reliability soak it cost the soak 10 of its
# 600 answers once, and the stop module, quiet since, waited 112-133 s for it to end
background.declare("rehearsal", ["tests/test_rehearsal.py::test_the_shipped_gpu_configs_rehearsed_on_a_cpu"],
                   _rehearsal, seconds=110, start_with="tests/test_openai_engine.py")


def test_the_shipped_gpu_configs_rehearsed_on_a_cpu():
    r = background.result("rehearsal", timeout=1200)  # a bound on a hang, not a timing
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
    # Ray's autoscaler on cluster.yaml's node types: GPU workers from zero, by accelerator type, as many as each needs
    assert seen["workers_at_start"] == {"cpu_worker": 2}  # min_workers; no GPU node before a job asks for one
    assert seen["workers_for_the_job"] == {"cpu_worker": 2, "h100_worker": 2}  # 15.5 H100s: two p5 nodes of 8
    assert seen["workers_for_the_app"] == {"cpu_worker": 2, "h100_worker": 2}  # 16 H100s at minimum scale: the same two
    assert seen["ingress_on"] == ["cpu_worker", "cpu_worker"]  # router_resources: off the GPU nodes
