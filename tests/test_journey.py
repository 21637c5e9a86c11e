"""The cluster journey as one flow (tests/journey.py, in a process of its own so that its Ray runs with token auth on):
the evaluation job through the Jobs API to S3, fit from S3 to S3, serve deploy with two ingress replicas on two
nodes, routed requests, the monitor with its state on S3, drifted traffic, a new router version, both replicas
on it."""
import json
import os
import sys
from pathlib import Path

import pytest

import background

pytestmark = pytest.mark.slow


def _journey(folder):
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # the journey's Ray keeps auth on
    return [[sys.executable, Path(__file__).with_name("journey.py")]], background.isolated_env("journey", env), folder


# a process of its own, with a Ray of its own: it runs in the background beside the Serve apps' modules that start a
# Ray of their own and bound no latency (~140 s, about one core busy), not beside the unit tests, whose torch and ONNX
# threads keep both cores busy (tests/background.py)
background.declare("journey", ["tests/test_journey.py::test_the_cluster_journey_end_to_end"], _journey, seconds=70,
                   start_with="tests/test_gateway.py")


def test_the_cluster_journey_end_to_end():
    r = background.result("journey", timeout=600)  # a bound on a hang, not a timing
    assert r.returncode == 0, r.stderr[-5000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["job"] == "SUCCEEDED" and seen["ingress_nodes"] == ["head", "worker"] and seen["replicas"] == 2
    assert seen["drifted"] >= 10 and seen["router_path"].startswith("s3://journey/monitor/routers/v0001")
    assert seen["switched_replicas"] == 2
    # each node downloaded both versions, each file once: version 0's 6 arrays (reference, accuracies, costs, the
    # training queries' ids and tasks, the outlier threshold), then the 5 the grown version changed (not the threshold)
    assert seen["cached_head"] == seen["cached_worker"] == 11
