"""Ray's own autoscaler on cluster.yaml's node types, on this machine: Ray's fake multi-node provider (it ships with
Ray) launches each worker "node" as a raylet here, as the AWS provider would launch an instance — from zero, by the
resources a task or replica asks for (an ``accelerator_type``), within each type's ``min_workers`` / ``max_workers``
and the cluster's ``max_workers``. The head is cluster.yaml's (``CPU: 0``, its dashboard on 127.0.0.1); each worker
type keeps cluster.yaml's resources, with the CPUs and GPUs its instance type would bring declared (scaled down on
CPUs: the raylets share this machine's two cores; a simulated engine needs none of them).

Every process of this cluster carries a mark in its environment (``ray start`` passes its environment to the head's
processes, whose autoscaler starts each worker node with it, whose raylets start the workers with it): ``stop()``
ends those and only those (proxray serve's own stop, ``proxray.cli.serving.marked``), where Ray's
``AutoscalingCluster`` runs ``ray stop --force`` — which would end every Ray on the machine, another test worker's too."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from proxray.cli.serving import SUPERVISED, _end, marked
from proxray.serve.front import free_port

ROOT = Path(__file__).resolve().parents[1]
INSTANCE = {"m6i.2xlarge": {"CPU": 2}, "p5.48xlarge": {"CPU": 16, "GPU": 8}, "p4de.24xlarge": {"CPU": 16, "GPU": 8},
            "p3dn.24xlarge": {"CPU": 16, "GPU": 8}}  # what each instance type brings, CPUs scaled to this machine
HEAD_TYPE = "ray.head.default"


def autoscaler_config(gcs_address: str) -> dict:
    """cluster.yaml as the fake multi-node provider reads it: its node types, limits and timings, the provider swapped."""
    c = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    head = c["available_node_types"][c["head_node_type"]]
    types = {HEAD_TYPE: {"resources": dict(head["resources"]), "node_config": {}, "max_workers": 0}}
    for name, t in c["available_node_types"].items():
        if name == c["head_node_type"]:
            continue
        types[name] = {"resources": {**INSTANCE[t["node_config"]["InstanceType"]], **t["resources"]}, "node_config": {},
                       "min_workers": t.get("min_workers", 0), "max_workers": t["max_workers"]}
    return {"cluster_name": c["cluster_name"], "max_workers": c["max_workers"], "upscaling_speed": c["upscaling_speed"],
            "idle_timeout_minutes": c["idle_timeout_minutes"],
            "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                         "disable_launch_config_check": True, "gcs_address": gcs_address},
            "auth": {"ssh_user": "ray"}, "available_node_types": types, "head_node_type": HEAD_TYPE, "docker": {},
            "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
            "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
            "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
            "worker_start_ray_commands": []}


class ClusterYamlAutoscaler:
    def __init__(self, work: Path, port: int, dashboard_port: int):
        import ray._private.services as services

        self.work, self.port, self.dashboard_port = work, port, dashboard_port
        self.address = f"{services.get_node_ip_address()}:{port}"
        self.bin = str(Path(sys.executable).parent)  # the environment's `ray`, as cluster.yaml's image has it on PATH
        self.marker = f"cluster-{os.getpid()}-{os.urandom(6).hex()}"

    def start(self, env: dict) -> None:
        """``ray start --head`` with the autoscaler's config where `ray up` leaves it on a head,
        ``~/ray_bootstrap_config.yaml`` (``env``'s HOME), which ``proxray check --address`` reads on the head."""
        path = Path(env["HOME"]) / "ray_bootstrap_config.yaml"
        path.write_text(json.dumps(autoscaler_config(self.address)))
        head = autoscaler_config(self.address)["available_node_types"][HEAD_TYPE]["resources"]
        env = {**env, "PATH": f"{self.bin}:{env.get('PATH', '')}", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
               "RAY_FAKE_CLUSTER": "1", SUPERVISED: self.marker}
        subprocess.run([f"{self.bin}/ray", "start", "--head", f"--autoscaling-config={path}", f"--port={self.port}",
                        f"--num-cpus={head['CPU']}", "--dashboard-host=127.0.0.1",
                        f"--dashboard-port={self.dashboard_port}", "--disable-usage-stats",
                        f"--dashboard-agent-listen-port={free_port()}"],  # not 52365, which another Ray may hold
                       env=env, check=True, capture_output=True, text=True)

    def stop(self) -> None:
        """Every process of this cluster ended (SIGTERM, then SIGKILL to those left after 5 s); twice, for one a
        raylet started while the others stopped."""
        import ray._common.utils

        for _ in range(2):
            _end(marked(self.marker))
        ray._common.utils.reset_ray_address()  # as `ray stop` does: `ray.init()` here no longer finds this cluster

    @staticmethod
    def kinds() -> dict:
        """{node id: node type} of the live nodes, from the GCS's node table (each type told apart by its resources)."""
        import ray

        out = {}
        for n in ray.nodes():
            r = n["Resources"]
            if n["Alive"]:
                out[n["NodeID"]] = "head" if "node:__internal_head__" in r else next(
                    (f"{a.split(':')[1].lower()}_worker" for a in r if a.startswith("accelerator_type:")),
                    "cpu_worker" if "proxray_ingress" in r else "other")
        return out

    def workers(self) -> dict:
        """{node type: live workers}."""
        return dict(collections.Counter(k for k in self.kinds().values() if k != "head"))

    def workers_of(self, node_ids) -> list:
        """The node types of ``node_ids``."""
        kinds = self.kinds()
        return [kinds.get(n, "gone") for n in node_ids]
