"""A GPU node lost without a drain, on a multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``) laid out
as the shipped ``cluster.yaml``: a head with 0 CPUs, two CPU workers for the ingress (``proxray_ingress``, as its
``cpu_worker`` type declares) and two GPU workers declaring 2 H100s each. Every process of the node — raylet, workers,
agents — gets SIGKILL; a new GPU node joins later, as the autoscaler would bring one.

* Serving, with the shipped H100 app's serving arguments (two ingress replicas, at most one a node, 2 CPUs each, kept
  off the GPU nodes by ``router_resources``) and four simulated models of the demo pool, one H100 each, 0.3 s answers:
  four clients routing at λ = 0 and one naming a model on each GPU worker, entering through the head's proxy, which
  survives. The worker holding the routed favourite is killed.
* The evaluation job: three slow simulated models on the H100 workers, one of which is killed mid-job.

Marked slow (five raylets)."""
import collections
import statistics
import threading
import time

import pytest
from serve_helpers import STRONG, WEAK, SLOW, BROKEN, fit_router, free_port, kill_node

pytestmark = pytest.mark.slow

GPU = {"num_cpus": 1, "num_gpus": 2, "resources": {"accelerator_type:H100": 2}}
INGRESS = {"num_cpus": 2, "resources": {"proxray_ingress": 1}}  # cluster.yaml's cpu_worker, scaled to this machine
FAILOVER_S = 1.0
# the GCS declares a node dead after 3 failed health checks a second apart (Ray's default: 5, 3 s apart, ~15 s): what
# follows a node's loss is the same, sooner
NODE_DEATH_IN_3_S = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                      "_system_config": NODE_DEATH_IN_3_S})
    for _ in range(2):
        c.add_node(**INGRESS)
    gpus = [c.add_node(**GPU) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c, gpus, []  # the cluster, its GPU workers (live or not), those killed
    from ray import serve

    serve.shutdown()
    ray.shutdown()
    c.shutdown()


def replicas_by_node() -> dict:
    """node id -> the deployments (class names) of its live Serve replicas, from the GCS's actor table."""
    from ray._private.state import actors

    out = collections.defaultdict(list)
    for a in actors().values():
        if a["State"] == "ALIVE" and a["ActorClassName"].startswith("ServeReplica:"):
            out[a["Address"]["NodeID"]].append(a["ActorClassName"].split(":")[-1])
    return out


def test_a_gpu_worker_killed_under_routed_load_costs_no_routed_request(cluster, tmp_path):
    import httpx
    from ray import serve

    from proxray import SentenceEncoder
    from proxray.common.naming import slug
    from proxray.serve.app import build_app

    c, gpus, dead = cluster
    pool = [WEAK, SLOW, BROKEN, STRONG]
    fit_router(tmp_path / "router", SentenceEncoder("static"), pool)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")  # the proxy that survives
    # one replica each: the new node's two GPUs are the lost replicas' room, not another model's autoscaling's (a
    # model whose routed share grows after the kill could otherwise take the GPU the lost model needs)
    models = [{"id": m, "engine": "sim", "num_gpus": 1, "accelerator_type": "H100", "engine_kwargs": {"latency_s": 0.3},
               "autoscaling": {"min_replicas": 1, "max_replicas": 1}} for m in pool]
    serve.run(build_app({"router": str(tmp_path / "router"), "encoder": "static", "models": models, "lam": 0.0,
                         "timeout_s": 10, "failover_s": FAILOVER_S, "router_replicas": 2,
                         "router_max_replicas_per_node": 1, "router_num_cpus": 2,
                         "router_resources": {"proxray_ingress": 0.01}}), name="proxray", route_prefix="/")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    first = httpx.post(url, json={"model": "proxray", "messages": [{"role": "user", "content": "What is 2 plus 7?"}]},
                       timeout=30)
    favourite = first.json()["proxray"]["model"]
    assert favourite == BROKEN  # the best and cheapest to the router at λ = 0

    placed = replicas_by_node()
    gpu_ids = {n.node_id for n in gpus}
    assert all("RouterIngress" not in placed[n] for n in gpu_ids)  # the ingress shares no fate with the GPU nodes
    assert sum("RouterIngress" in v for v in placed.values()) == 2
    victim = next(n for n in gpus if slug(favourite) in " ".join(placed[n.node_id]))
    survivor = next(n for n in gpus if n is not victim)
    lost_named = favourite
    kept_named = next(m for m in pool if slug(m) in " ".join(placed[survivor.node_id]))

    results, stop = [], threading.Event()

    def client(i: int, model: str):
        n = 0
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                t0 = time.time()
                try:
                    r = http.post(url, json={"model": model, "messages": [{"role": "user",
                                                                            "content": f"What is {n} plus {i}?"}]})
                    status, body, retry = r.status_code, r.text, r.headers.get("retry-after")
                except httpx.HTTPError as e:
                    status, body, retry = -1, repr(e), None
                results.append({"t0": t0, "s": time.time() - t0, "model": model, "status": status, "body": body,
                                "retry": retry})
                n += 1
                if status == 503:
                    time.sleep(float(retry or 1) / 4)  # a client that honours Retry-After, a little eagerly

    threads = [threading.Thread(target=client, args=(i, "proxray")) for i in range(4)]
    threads += [threading.Thread(target=client, args=(8, lost_named)), threading.Thread(target=client,
                                                                                        args=(9, kept_named))]
    for t in threads:
        t.start()
    deadline = time.time() + 60
    while sum(r["status"] == 200 for r in results) < 40 and time.time() < deadline:  # load before the kill
        time.sleep(0.2)
    killed_at = time.time()
    assert kill_node(victim) >= 2
    dead.append(victim)
    while time.time() < killed_at + 8:  # the lost node's replicas are gone; no node has a free H100
        time.sleep(0.2)
    joined_at = time.time()
    gpus.append(c.add_node(**GPU))  # a new node joins, as the autoscaler would launch one

    def back():
        return any(r["model"] == lost_named and r["status"] == 200 and r["t0"] > joined_at for r in results)
    while not back() and time.time() < joined_at + 90:
        time.sleep(0.2)
    back_after = min((r["t0"] + r["s"] for r in results if r["model"] == lost_named and r["status"] == 200
                      and r["t0"] > joined_at), default=None)
    stop.set()
    for t in threads:
        t.join()

    before = [r for r in results if r["t0"] + r["s"] < killed_at]
    normal = statistics.median(r["s"] for r in before if r["model"] == "proxray")
    in_flight = [r for r in results if r["t0"] < killed_at < r["t0"] + r["s"]]
    after = [r for r in results if r["t0"] >= killed_at]
    routed = [r for r in in_flight + after if r["model"] == "proxray"]
    lost = [r for r in in_flight + after if r["model"] == lost_named and r["t0"] < joined_at]
    kept = [r for r in in_flight + after if r["model"] == kept_named]
    longest = max(r["s"] for r in routed)
    unavailable = [r for r in lost if r["status"] == 503]
    print(f"normal routed answer {normal:.2f} s; after the kill: {len(routed)} routed "
          f"({collections.Counter(r['status'] for r in routed)}), the longest {longest:.2f} s; "
          f"{len(lost)} naming the lost model ({collections.Counter(r['status'] for r in lost)}), the longest "
          f"{max(r['s'] for r in lost):.2f} s; {len(kept)} naming a kept model "
          f"({collections.Counter(r['status'] for r in kept)}); the lost model answered again "
          f"{back_after - joined_at if back_after else float('nan'):.1f} s after a new node joined")
    assert routed and all(r["status"] == 200 for r in routed), [r["body"][:200] for r in routed if r["status"] != 200]
    assert longest <= normal + FAILOVER_S + 1.0  # no routed request waits much past one failover
    assert kept and all(r["status"] == 200 for r in kept), [r["body"][:200] for r in kept if r["status"] != 200]
    assert unavailable and all(r["status"] in (200, 503) for r in lost), [r["body"][:200] for r in lost]
    for r in unavailable:  # fast, named, with Retry-After
        assert lost_named in r["body"] and r["retry"] == "1" and '"type":"service_unavailable"' in r["body"], r
        assert r["s"] <= FAILOVER_S + 1.5, r
    assert back_after is not None  # the lost model answers again once a node has room for it


def test_the_evaluation_job_loses_a_gpu_worker_and_finishes_every_row_once(cluster, tmp_path):
    from ray import serve

    from proxray.common.storage import Store
    from proxray.evaljob import JobConfig, run_job

    c, gpus, dead = cluster
    serve.shutdown()  # the app of the test above gives its GPUs back
    models = [{"id": m, "engine": "sim", "accelerator_type": "H100", "num_gpus": 1, "num_cpus": 0.1, "batch_size": 4,
               "price": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}, "engine_kwargs": {"latency_s": 0.4}}
              for m in (WEAK, BROKEN, STRONG)]
    config = JobConfig.model_validate({"output": "unused", "sampling": {"max_tokens": 8}, "models": models,
                                       "query_sets": [{"name": "synthetic", "synthetic": {"n_per_task": 5,
                                                                                          "seed": 3}}]})
    out, got = tmp_path / "table", {}
    def evaluate():
        try:
            got.update(run_job(config, out))
        except Exception as e:  # noqa: BLE001 - the assertion below shows it
            got["error"] = repr(e)
    job = threading.Thread(target=evaluate)
    t0 = time.time()
    job.start()
    def busy_gpu_node():  # a live GPU worker running some of the job's engines (its only actors, Serve gone)
        from ray._private.state import actors

        busy = {a["Address"]["NodeID"] for a in actors().values() if a["State"] == "ALIVE"}
        return next((n for n in gpus if n.node_id in busy and n not in dead), None)
    victim = None
    while victim is None and time.time() < t0 + 60:
        time.sleep(0.5)
        victim = busy_gpu_node()
    assert victim is not None, "no engine started on a GPU worker"
    time.sleep(2)  # some batches done, some in flight
    kill_node(victim)
    dead.append(victim)
    killed_at = time.time()
    gpus.append(c.add_node(**GPU))  # room for the engines it held, as the autoscaler would bring
    job.join(timeout=300)
    assert not job.is_alive(), "the job did not finish"
    rows = Store(out).read_parts("table")
    keys = collections.Counter(zip(rows["model"], rows["query_id"]))
    n_queries = len(set(rows["query_id"]))
    print(f"{len(rows)} rows of {len(models)} models x {n_queries} queries; a GPU worker killed "
          f"{killed_at - t0:.1f} s in; the job finished {time.time() - t0:.1f} s after it started")
    assert "error" not in got, got
    assert got["complete_queries"] == n_queries and len(keys) == len(models) * n_queries
    assert max(keys.values()) == 1  # every (model, query) row exactly once

