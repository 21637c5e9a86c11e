"""The served endpoint on a multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head and a worker
node, each with its own proxray cache folder, nothing shared on local disk): the router artifact lives on an S3 API
(moto's server on 127.0.0.1), two ingress replicas spread over the two nodes, each downloads the router into its
own node's cache, and routed answers come from both."""
import numpy as np
import pytest
from serve_helpers import STRONG, WEAK, fit_router, free_port, node_front

pytestmark = pytest.mark.slow


@pytest.fixture
def two_nodes(tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    caches = {name: tmp_path / f"cache-{name}" for name in ("head", "worker")}
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                                                      "env_vars": {"PROXRAY_CACHE": str(caches["head"])}})
    front = node_front({"PROXRAY_CACHE": str(caches["worker"])})
    worker = c.add_node(num_cpus=2, env_vars=front)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield caches, {c.head_node.node_id: "head", worker.node_id: "worker"}, int(front["RAY_SERVE_WORKER_PROXY_HTTP_PORT"])
    from ray import serve

    serve.shutdown()
    ray.shutdown()
    c.shutdown()


def test_two_ingress_replicas_on_two_nodes_route_with_one_router_from_s3(s3, two_nodes, tmp_path, encoder):
    import httpx
    from ray import serve
    from ray._private.state import actors  # the GCS's actor table (the state API needs a dashboard)

    from proxray.routing.registry import load_router
    from proxray.serve.app import build_app

    uri, client, _ = s3
    caches, names, worker_port = two_nodes
    base, _, query = uri.partition("?")
    art = f"{base}/routers/served?{query}"
    fit_router(tmp_path / "local", encoder, [WEAK, STRONG])
    load_router(tmp_path / "local").save(art)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app({"router": art, "models": [{"id": m, "engine": "sim"} for m in (WEAK, STRONG)],
                         "router_replicas": 2, "router_max_replicas_per_node": 1, "router_num_cpus": 0.5}),
              name="proxray", route_prefix="/")
    ingress = [a for a in actors().values() if a["ActorClassName"].endswith("RouterIngress") and a["State"] == "ALIVE"]
    assert sorted(names[a["Address"]["NodeID"]] for a in ingress) == ["head", "worker"]  # one replica on each node
    for node, folder in caches.items():  # each node downloaded the router once, into its own cache
        # reference, accuracies, costs, the training queries' ids and tasks, the outlier threshold
        assert len(list((folder / "artifacts").iterdir())) == 6, node
    paths = set()
    for i in range(8):  # through the head's HAProxy and the worker node's, each reaching the replicas of both nodes
        front = port if i % 2 == 0 else worker_port
        r = httpx.post(f"http://127.0.0.1:{front}/v1/chat/completions", timeout=30,
                       json={"model": "proxray", "messages": [{"role": "user", "content": f"What is {i} plus 7?"}]})
        assert r.status_code == 200, (front, r.text)
        paths.add(r.json()["proxray"]["router_path"])
    assert paths == {art}
    assert np.isfinite(load_router(art).estimate(encoder.encode(["What is 2 plus 7?"]))[0]).all()


def replica_nodes(deployment: str, names: dict) -> list:
    """The nodes ("head" / "worker") of a deployment's live replicas, from the GCS's actor table."""
    from ray._private.state import actors

    return sorted(names[a["Address"]["NodeID"]] for a in actors().values()
                  if a["ActorClassName"].endswith(f":{deployment}") and a["State"] == "ALIVE")


def test_routed_load_scales_a_model_out_onto_the_other_node_and_back(two_nodes, tmp_path, encoder):
    """Routed load on one model (allowed_models) scales its deployment from one replica to two, the second on the
    other node (max_replicas_per_node: 1), and back to one when the load stops: waits on the cluster's state."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from ray import serve

    from proxray.serve.app import build_app, deployment_name

    caches, names, _ = two_nodes
    fit_router(tmp_path / "router", encoder, [WEAK, STRONG])
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    slow = {"id": STRONG, "engine": "sim", "engine_kwargs": {"latency_s": 0.4}, "max_replicas_per_node": 1,
            "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1, "upscale_delay_s": 0.5,
                            "downscale_delay_s": 3, "metrics_interval_s": 0.5, "look_back_period_s": 1}}
    serve.run(build_app({"router": str(tmp_path / "router"), "models": [{"id": WEAK, "engine": "sim"}, slow]}),
              name="proxray", route_prefix="/")
    name = deployment_name(STRONG)
    assert len(replica_nodes(name, names)) == 1
    body = {"model": "proxray", "messages": [{"role": "user", "content": "Route me to the strong one."}],
            "proxray": {"allowed_models": [STRONG]}}
    peak, deadline = [], time.time() + 180  # a bound on a hang: it returns once scaled out
    with ThreadPoolExecutor(8) as pool:
        while time.time() < deadline and len(peak) < 2:
            codes = list(pool.map(lambda _: httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                                                       timeout=30).status_code, range(16)))
            assert codes == [200] * 16
            peak = max(peak, replica_nodes(name, names), key=len)
    assert peak == ["head", "worker"], peak  # scaled out, the second replica on the other node
    deadline = time.time() + 180  # a bound: it returns once scaled back in
    while time.time() < deadline and len(replica_nodes(name, names)) > 1:
        time.sleep(1)
    assert len(replica_nodes(name, names)) == 1, "the model did not scale back in"
