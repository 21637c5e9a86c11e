"""The drift monitor on a cluster laid out as cluster.yaml lays out AWS: a head that runs no tasks (CPU 0) and whose
dashboard (the Jobs API) listens on its own localhost only, and a worker on another "machine" — two network
namespaces, each with its own 127.0.0.1, so the worker cannot reach the head's dashboard — both started with
cluster.yaml's own start commands (Ray's token auth on from the token file, ~/.proxray/env in the raylets'
environment: a task on the worker sees its variable). The monitor is started the guide's way (``ray job submit --working-dir …
-- proxray monitor start``, through the address the `ray dashboard` tunnel gives), drifted queries reach it, it
evaluates them through the Jobs API (the job's tasks on the worker) and grows the router; ``proxray monitor status``
answers in the shell ``ray exec cluster.yaml`` opens on the head (``~/.bashrc`` as cluster.yaml's setup writes it,
nothing else set). While the evaluation runs, the worker is lost — every process in its namespace gets SIGKILL, no
drain — and a new worker starts there, as the autoscaler would launch one: the monitor carries on and the evaluation
finishes (resumed by the job, or submitted again by the monitor), its rows exactly once."""
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netns import TwoHosts  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
DRIFTED = [f"Write a {lang} function that {ask}, with unit tests and a docstring."
           for lang in ("Python", "Rust", "Go") for ask in (
               "parses an ISO-8601 timestamp", "merges two sorted linked lists", "computes a CRC32 checksum",
               "rate-limits calls with a token bucket", "validates an IBAN", "detects a cycle in a directed graph")]
# the head's GCS declares the lost worker dead after 3 failed health checks a second apart (Ray's default: 5, 3 s
# apart): what follows the loss is the same, sooner
NODE_DEATH_IN_3_S = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
REPORT = """
import json, sys, ray
from ray.util.state import list_actors
from proxray.embeddings.encoder import SentenceEncoder
from proxray.monitor import get_monitor
from proxray.routing.registry import load_router
router = load_router(sys.argv[1])
prompts = json.loads(sys.argv[2])
X = SentenceEncoder(router.encoder_id_, progress=False).encode(prompts)
ray.init(address="auto", namespace="proxray", log_to_driver=False)
mon = get_monitor()
drifted = ray.get([mon.report.remote(p, x, float(s)) for p, x, s in zip(prompts, X, router.outlier_score(X))])
node = [a.node_id for a in list_actors(filters=[("name", "=", "proxray-monitor")])][0]
on_worker = ray.remote(num_cpus=1)(lambda: __import__("os").environ.get("PROXRAY_PROBE_KEY"))
print(json.dumps({"drifted": sum(drifted), "node": node, "head": ray.get_runtime_context().get_node_id(),
                  "worker_env": ray.get(on_worker.remote())}))
"""


def _bashrc_lines() -> list:
    """cluster.yaml's setup commands that write ~/.bashrc (the shell `ray exec` runs commands in sources it)."""
    setup = yaml.safe_load((ROOT / "cluster.yaml").read_text())["setup_commands"]
    return [c for c in setup if "~/.bashrc" in c]


def _start_commands(kind: str) -> list:
    """cluster.yaml's start commands of a node type but `ray stop` (which would stop every Ray on this machine)."""
    return [c for c in yaml.safe_load((ROOT / "cluster.yaml").read_text())[f"{kind}_start_ray_commands"]
            if c != "ray stop"]


def test_cluster_yaml_keeps_the_dashboard_on_the_head_and_token_auth_in_ray_exec():
    head = [c for c in _start_commands("head") if "ray start" in c]
    assert len(head) == 1 and "--dashboard-host=127.0.0.1" in head[0] and "RAY_AUTH_MODE=token ray start" in head[0]
    assert any("export RAY_AUTH_MODE=token" in line for line in _bashrc_lines())


@pytest.fixture
def hosts():
    why = TwoHosts.available()
    if why:
        pytest.skip(f"network namespaces cannot be made here ({why})")
    h = TwoHosts()
    yield h
    h.close()


def test_the_monitor_evaluates_on_a_cluster_whose_head_has_no_cpus_and_private_dashboard(hosts):
    work = Path(tempfile.mkdtemp(prefix="pxn", dir="/tmp"))  # short: Ray's socket paths live under it
    try:
        _journey(hosts, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _journey(hosts, work):
    home = work / "home"
    (home / ".ray").mkdir(parents=True)
    old = os.umask(0o077)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))  # `ray get-auth-token --generate`'s file
    os.umask(old)
    (home / "proxray").symlink_to(ROOT)  # the repository where the image holds it (deploy/Dockerfile's WORKDIR)
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    base.update(HOME=str(home), RAY_TMPDIR=str(work / "t"), PROXRAY_CACHE=str(work / "cache"))
    (work / "t").mkdir()
    venv = {**base, "PATH": f"{VENV_BIN}:{base['PATH']}"}

    # the router and the monitor's config, on storage both "machines" read (one disk here, the bucket there)
    cfg = yaml.safe_load((ROOT / "monitor_configs" / "cpu_demo.yaml").read_text())
    models = ",".join(m["id"] for m in cfg["job"]["models"])  # the README's demo router: the demo pool's models
    r = hosts.run(hosts.head, [str(VENV_BIN / "proxray"), "fit", "--router", "knn", "--k", "50", "--out",
                               str(work / "router"), "--models", models], {**venv, "RAY_AUTH_MODE": "disabled"},
                  cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    cfg.update(router=str(work / "router"), state_dir=str(work / "monitor"), min_batch=8, shadow_rate=0.0, tick_s=1)
    for m in cfg["job"]["models"]:  # slow models, small batches: the evaluation runs long enough to lose its worker
        m.update(batch_size=2, engine_kwargs={"latency_s": 1.0})
    conf = work / "conf"
    conf.mkdir()
    (conf / "monitor.yaml").write_text(yaml.safe_dump(cfg))

    # the head and a worker as cluster.yaml starts them (its own command lines, run by bash as the launcher runs them;
    # the launcher adds --num-cpus=0 for the head's `resources: {CPU: 0}`, this machine adds each node's address),
    # ~/.proxray/env holding a variable for api_key_env
    (home / ".proxray").mkdir(mode=0o700)
    (home / ".proxray" / "env").write_text("PROXRAY_PROBE_KEY=reached-the-raylet\n")
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").touch()
    for kind, ns, extra in (("head", hosts.head, f" --node-ip-address={hosts.head_ip} --num-cpus=0"),
                            ("worker", hosts.worker, f" --node-ip-address={hosts.worker_ip} --num-cpus=4")):
        for cmd in _start_commands(kind):
            if "ray start" in cmd:
                cmd = cmd.replace(" --autoscaling-config=~/ray_bootstrap_config.yaml", "") + extra + \
                    " --disable-usage-stats"
            r = hosts.run(ns, ["bash", "-c", cmd], {**venv, "RAY_HEAD_IP": hosts.head_ip, **NODE_DEATH_IN_3_S})
            assert r.returncode == 0, (cmd, r.stdout[-2000:] + r.stderr[-2000:])
    assert oct((home / ".proxray" / "env").stat().st_mode & 0o777) == "0o600"  # made owner-only before Ray starts
    probe = hosts.run(hosts.worker, [sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 8265), 2)"],
                      venv, timeout_s=30)
    assert probe.returncode != 0, "the worker reaches a dashboard on its own 127.0.0.1: the test shows nothing"

    # step 9 of the guide: started through the Jobs API (the `ray dashboard` tunnel's address on the head)
    tunnel = {**venv, "RAY_AUTH_MODE": "token", "RAY_ADDRESS": "http://127.0.0.1:8265"}
    r = hosts.run(hosts.head, [str(VENV_BIN / "ray"), "job", "submit", "--working-dir", str(conf), "--",
                               "proxray", "monitor", "start", "--config", "monitor.yaml", "--timeout", "240"],
                  tunnel, timeout_s=420)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    started = json.loads(r.stdout[r.stdout.index("{"):r.stdout.rindex("}") + 1])
    assert started["jobs_api"] == "http://127.0.0.1:8265" and started["router_version"] == 0

    # drifted traffic, reported as the ingress replicas report it
    r = hosts.run(hosts.head, [sys.executable, "-c", REPORT, str(work / "router"), json.dumps(DRIFTED)],
                  {**venv, "RAY_AUTH_MODE": "token"})
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["drifted"] >= 8, seen
    assert seen["node"] == seen["head"]  # the monitor runs where the Jobs API's recorded address answers
    assert seen["worker_env"] == "reached-the-raylet"  # ~/.proxray/env reached a task on the worker (no CPU on the head)

    # `ray exec cluster.yaml 'proxray monitor status'`: the head's shell, ~/.bashrc as cluster.yaml writes it
    bashrc = home / ".bashrc"
    bashrc.touch()
    for line in _bashrc_lines():
        r = hosts.run(hosts.head, ["bash", "-c", line], base)
        assert r.returncode == 0, r.stderr
    plain = {k: v for k, v in base.items() if k not in ("VIRTUAL_ENV",)}
    plain["PATH"] = f"{VENV_BIN}:{plain['PATH']}"  # the image's ENV PATH: its environment first, nothing else set

    status, lost = {}, None
    deadline = time.time() + 420
    while time.time() < deadline:
        r = hosts.run(hosts.head, ["bash", "-c", "source ~/.bashrc; (proxray monitor status)"], plain, timeout_s=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        status = json.loads(r.stdout)
        drift = [j for j in status["jobs"] if j["kind"] == "drift"]
        if drift and (drift[0]["status"] == "FAILED" or drift[0]["status"] == "DONE" and status["router_version"]):
            break
        if lost is None and drift and drift[0]["status"] == "RUNNING" and _engines_started(work):
            lost = hosts.kill(hosts.worker)  # the worker lost mid-evaluation, without a drain
            for cmd in _start_commands("worker"):  # a new worker in its place, as the autoscaler would launch
                if "ray start" in cmd:
                    cmd += f" --node-ip-address={hosts.worker_ip} --num-cpus=4 --disable-usage-stats"
                r = hosts.run(hosts.worker, ["bash", "-c", cmd], {**venv, "RAY_HEAD_IP": hosts.head_ip})
                assert r.returncode == 0, (cmd, r.stdout[-2000:] + r.stderr[-2000:])
        time.sleep(3)
    drift = [j for j in status["jobs"] if j["kind"] == "drift"]
    assert lost, "the evaluation ended before the worker could be lost under it"
    assert drift and drift[0]["status"] == "DONE", json.dumps(status)[-3000:]
    assert status["router_version"] >= 1 and drift[0]["charged"] > 0
    print(f"worker lost mid-evaluation ({lost} processes killed); evaluation {drift[0]['job'] or drift[0]['id']} DONE")
    from proxray.evaljob import graded_parts

    rows = graded_parts(str(work / "monitor" / "evaluations" / drift[0]["id"] / "out"))
    assert rows.duplicated(["model", "query_id"]).sum() == 0 and len(rows) > 0  # every row exactly once


def _engines_started(work: Path) -> bool:
    """Whether the drift evaluation has written its first rows (so the worker is lost mid-job, not before it)."""
    return any((work / "monitor").rglob("part-*.parquet"))
