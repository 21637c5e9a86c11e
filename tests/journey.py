"""The cluster journey, each step as a user takes it, on a multi-node Ray cluster on this machine with Ray's token
auth on and every artifact on an S3 API (moto's server on 127.0.0.1, named by AWS_ENDPOINT_URL):

  the evaluation job through the Jobs API, --out s3://  ->  proxray fit from the S3 table to an S3 router
  ->  serve deploy with that router and two ingress replicas on two nodes  ->  routed requests (openai client)
  ->  proxray monitor start with its state on S3  ->  drifted traffic  ->  a new router version on S3
  ->  both ingress replicas answer with it.

Run by tests/test_journey.py in a process of its own (its Ray runs with auth on; the test suite's is off). Nodes
share nothing on local disk: each has its own proxray cache folder. Prints one JSON line of what it saw, last."""
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from proxray.serve.front import free_port

ROOT = Path(__file__).resolve().parents[1]
POOL = ["meta-llama/Llama-3.2-1B-Instruct", "google/gemma-7b-it", "meta-llama/Llama-3.3-70B-Instruct"]
PRICES = {POOL[0]: (0.01, 0.02), POOL[1]: (0.03, 0.05), POOL[2]: (0.15, 0.30)}
NEW_TASK = "medqa"  # left out of the evaluated query set: what drifted traffic brings


def step(msg: str) -> None:
    print(f"[journey {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def until(what: str, check, timeout_s: float, every_s: float = 1.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")


def submit_when_ready(jobs, **job) -> str:
    """``jobs.submit_job(**job)`` once the head's job agent has registered, a while after the dashboard answers (a 500
    "No available agent" until then, nothing submitted)."""
    def submitted():
        try:
            return jobs.submit_job(**job)
        except RuntimeError as e:
            if "No available agent" not in str(e):
                raise
            return None

    return until("the head's job agent", submitted, 120)


def deploy_when_accepted(argv, timeout_s: float = 180) -> None:
    """``serve deploy`` until the dashboard accepts the config. The PUT is declarative, so sending the same config
    again deploys nothing twice; on a loaded head the first one can fail while Serve's controller starts. Each
    refusal is printed, so one that never clears shows why."""
    def accepted():
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if r.returncode:
            step(f"serve deploy refused ({r.returncode}): {(r.stdout + r.stderr)[-2000:]}")
        return r.returncode == 0

    until("serve deploy accepted", accepted, timeout_s, 3.0)


def listeners(port: int) -> list:
    """The processes listening on TCP ``port`` of this machine: pid, command and the background work that started
    them (tests/background.py), for a failure to name who answered."""
    from proxray.serve.front import listening_sockets

    links = {f"socket:[{inode}]" for inode in (listening_sockets() or {}).get(port, ())}
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")) if links else ():
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in links for fd in os.listdir(f"/proc/{pid}/fd")):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                work = next((v.decode().split("=", 1)[1] for v in env if v.startswith(b"PROXRAY_BACKGROUND_WORK=")), "")
                found.append({"pid": int(pid), "cmd": cmd, "work": work})
        except OSError:
            continue
    return found


def cli(*args, timeout_s=600) -> str:
    with tempfile.TemporaryDirectory() as cwd:  # a working directory of its own: nothing read from the repo's
        r = subprocess.run([sys.executable, "-m", "proxray", *args], capture_output=True, text=True,
                           timeout=timeout_s, cwd=cwd)
    if r.returncode:
        err = r.stderr if len(r.stderr) <= 4000 else f"{r.stderr[:2000]}\n[…]\n{r.stderr[-2000:]}"  # a crash's reason
        raise RuntimeError(f"proxray {' '.join(args)} failed ({r.returncode}):\n{err}")  # comes first, its stack last
    return r.stdout


def main() -> None:
    import yaml
    from moto.server import ThreadedMotoServer

    work = Path(tempfile.mkdtemp())
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                       "AWS_ENDPOINT_URL": f"http://{host}:{port}",
                       "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
                       # the proxy spreads requests over both ingress replicas instead of preferring its own node's
                       "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0"})
    import boto3

    boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1").create_bucket(Bucket="journey")

    import ray
    from ray.cluster_utils import Cluster
    from serve_helpers import node_front

    from proxray.common.storage import write_file
    from proxray.data.synthetic import generate_queries

    dash, http_port = free_port(), free_port()
    caches = {name: work / f"cache-{name}" for name in ("head", "worker")}
    # the head's job agent on a port of its own: Ray's default (52365) may be held by another Ray on the machine, and
    # then no job can be submitted ("No available agent"); Cluster gives only the other nodes free ones
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 3, "include_dashboard": True, "dashboard_port": dash, "dashboard_agent_listen_port": free_port(),
        "env_vars": {"PROXRAY_CACHE": str(caches["head"])}})
    worker = cluster.add_node(num_cpus=3, env_vars=node_front({"PROXRAY_CACHE": str(caches["worker"])}))
    cluster.wait_for_nodes()
    os.environ["RAY_ADDRESS"] = cluster.address
    dashboard = f"http://127.0.0.1:{dash}"
    seen = {"nodes": 2}
    try:
        # 1. the evaluation job, through the Jobs API, its config, queries and output on S3
        step("submit the evaluation job")
        q = generate_queries(25, seed=4)
        train_q, new_q = q[q.task != NEW_TASK], generate_queries(30, seed=11, tasks=[NEW_TASK])
        write_file("s3://journey/queries.jsonl", train_q.to_json(orient="records", lines=True).encode())
        job = {"sampling": {"max_tokens": 16},
               "models": [{"id": m, "engine": "sim", "num_cpus": 0.25,
                           "price": {"input_per_mtok": PRICES[m][0], "output_per_mtok": PRICES[m][1]}} for m in POOL]}
        write_file("s3://journey/job.yaml", yaml.safe_dump(
            {**job, "query_sets": [{"name": "train", "path": "s3://journey/queries.jsonl"}]}).encode())
        from ray.job_submission import JobSubmissionClient

        jobs = JobSubmissionClient(dashboard)

        sid = submit_when_ready(jobs, entrypoint=f"{sys.executable} {ROOT / 'jobs' / 'build_table.py'} --config "
                                                 "s3://journey/job.yaml --out s3://journey/table",
                                submission_id="journey-table")
        status = until("the evaluation job", lambda: (s := jobs.get_job_status(sid)).is_terminal() and s, 300)
        assert str(status) == "SUCCEEDED", jobs.get_job_logs(sid)[-3000:]
        seen["job"] = str(status)

        # 2. fit from the S3 table to an S3 router
        step("fit the router")
        cli("fit", "--table", "s3://journey/table/routing_table.parquet", "--router", "knn", "--k", "20",
            "--out", "s3://journey/router")

        # 3. serve deploy: the router on S3, two ingress replicas on two nodes, reporting to the monitor
        step("serve deploy")
        app = {"proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": http_port},
               "applications": [{"name": "proxray", "route_prefix": "/", "import_path": "proxray.serve.app:build_app",
                                 "args": {"router": "s3://journey/router", "router_replicas": 2,
                                          "router_max_replicas_per_node": 1, "router_num_cpus": 0.5,
                                          "monitor": "journey-monitor", "reload_every_s": 1.0,
                                          "models": [{"id": m, "engine": "sim"} for m in POOL]}}]}
        (work / "serve.yaml").write_text(yaml.safe_dump(app))
        serve_bin = str(Path(sys.executable).with_name("serve"))
        deploy_when_accepted([serve_bin, "deploy", str(work / "serve.yaml"), "--address", dashboard])
        import openai

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0)

        def ask(prompt):
            try:
                return client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": prompt}])
            except openai.APIError:
                return None

        def answered_here():  # by this app's router: another app on the machine answering on this port is no answer
            a = ask("Is the app up?")
            return a is not None and a.model_extra["proxray"]["router_path"] == "s3://journey/router"

        try:
            until("the app answering", answered_here, 300, 2.0)
        except TimeoutError as e:
            raise AssertionError(f"{e}: port {http_port} held by {listeners(http_port)}") from None
        ray.init(address=cluster.address, log_to_driver=False)
        from ray._private.state import actors

        names = {cluster.head_node.node_id: "head", worker.node_id: "worker"}

        serve_actors = []  # what the last look found of Serve's actors: for the failure's message

        def ingress_nodes():
            table = actors().values()
            alive = [a for a in table if a["ActorClassName"].endswith("RouterIngress") and a["State"] == "ALIVE"]
            seen["ingress_nodes"] = sorted(names.get(a["Address"]["NodeID"], "elsewhere") for a in alive)
            serve_actors[:] = sorted(f"{a['ActorClassName']}={a['State']}" for a in table
                                     if a["ActorClassName"].startswith(("ServeReplica", "ServeController")))
            return seen["ingress_nodes"] == ["head", "worker"]

        try:  # both replicas placed and running: the state, not a moment of it
            until("both ingress replicas alive, one on each node", ingress_nodes, 60, 1.0)
        except TimeoutError as e:
            raise AssertionError(f"{e}: {seen}, Serve's actors {serve_actors}; port {http_port} held by "
                                 f"{listeners(http_port)}") from None
        def replicas_answering(path, prompts):
            """The ingress replicas that answered ``prompts``, if every answer came from the router at ``path``."""
            answers = [ask(p) for p in prompts]
            ok = all(a is not None and a.model_extra["proxray"]["router_path"] == path for a in answers)
            return {a.model_extra["proxray"]["replica"] for a in answers} if ok else set()

        first = until("both replicas answering with the router from S3",
                      lambda: (r := replicas_answering("s3://journey/router", list(train_q.prompt)[:8])) and len(r) == 2
                      and r, 60, 0.5)
        seen["replicas"] = len(first)

        # 4. the monitor, its state on S3, submitting its evaluations through the Jobs API
        step("proxray monitor start")
        monitor = {"name": "journey-monitor", "router": "s3://journey/router",
                   "table": "s3://journey/table/routing_table.parquet", "state_dir": "s3://journey/monitor",
                   "job": {**job, "grader": {"model": POOL[-1]},  # the pool answers the table's prompts as it records
                           "models": [{**m, "engine_kwargs": {"table": "s3://journey/table/routing_table.parquet"}}
                                      for m in job["models"]]},
                   "z": 2, "n_groups": 4, "min_batch": 10, "quantile": 0.95, "shadow_rate": 0.0, "tick_s": 1.0,
                   "jobs_address": dashboard, "submit": "jobs_api", "gate": {"window_s": 5.0}}
        write_file("s3://journey/monitor.yaml", yaml.safe_dump(monitor).encode())
        (work / "monitor.yaml").write_text(yaml.safe_dump(monitor))
        cli("monitor", "start", "--config", str(work / "monitor.yaml"), "--address", cluster.address)

        # 5. drifted traffic: a task the router never saw
        step("drifted traffic")
        for p in list(new_q.prompt):
            assert ask(p) is not None
        status = {}

        def grown():
            status.update(json.loads(cli("monitor", "status", "--name", "journey-monitor", "--address",
                                         cluster.address)))
            return status["served_version"] >= 1  # grown, through the gate (canaries, held-out, a 5 s window)

        try:
            until("a new router version", grown, 300, 3.0)
        except TimeoutError:
            print(json.dumps({k: status.get(k) for k in ("reported", "drifted", "drift_queue", "jobs", "blocked",
                                                         "events", "outlier_threshold", "gate", "label_sources")},
                             default=str), file=sys.stderr)
            raise
        seen["drifted"], seen["router_path"] = status["drifted"], status["router_path"]
        assert status["router_path"].startswith("s3://journey/monitor/routers/v0001")

        # 6. both ingress replicas switch to it
        step("both replicas on the new version")
        new = status["router_path"]
        switched = until("both replicas answering with the new version",
                         lambda: (r := replicas_answering(new, list(train_q.prompt)[:8])) and len(r) == 2 and r, 60, 1.0)
        assert switched == first  # the same two replicas, switched in place
        seen["switched_replicas"] = len(switched)
        for name, folder in caches.items():  # each node downloaded both versions into its own cache
            seen[f"cached_{name}"] = len(list((folder / "artifacts").iterdir()))
        print(json.dumps(seen))
    finally:
        try:
            subprocess.run([sys.executable, "-m", "proxray", "monitor", "stop", "--name", "journey-monitor",
                            "--address", cluster.address], capture_output=True, timeout=120)
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass
        ray.shutdown()
        cluster.shutdown()
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)  # the nodes' caches: a model and two router versions per run


if __name__ == "__main__":
    main()
