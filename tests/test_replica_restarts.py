"""Replicas that Serve replaces are not lost models: the CPU demo's app (its four simulated models, one replica each,
its ``timeout_s``) under routed and named load at 8 concurrent, every model replica killed once (Serve starts a new
one): no request fails — each waits for a replacement or falls back. Bounded in count and time; 127.0.0.1 only."""
import collections
import threading
import time

import httpx
import pytest
import yaml

from conftest import ROOT
from serve_helpers import start_app, stop_app

pytestmark = pytest.mark.slow
APP = "proxray-restarts"


@pytest.fixture(scope="module")
def demo(tmp_path_factory, encoder):
    args = yaml.safe_load((ROOT / "serve_configs/cpu_demo.yaml").read_text())["applications"][0]["args"]
    models = [{**m, "autoscaling": {"min_replicas": 1, "max_replicas": 1}} for m in args["models"]]
    yield start_app(tmp_path_factory.mktemp("restarts"), encoder, models, app_name=APP, timeout_s=args["timeout_s"],
                    failover_s=args.get("failover_s", 1.0),  # the shipped demo's failover
                    request_timeout_s=60), [m["id"] for m in models], args["timeout_s"]
    stop_app()


def _model_replicas():
    import ray

    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == "serve" and a["name"].startswith(f"SERVE_REPLICA::{APP}#")
            and "RouterIngress" not in a["name"]]


def test_every_model_replica_killed_under_load_fails_no_request(demo):
    import ray

    url, models, timeout_s = demo
    results, stop = [], threading.Event()

    def client(i):
        model = "proxray" if i < 6 else models[i - 6]  # six routed, two naming a model
        n = 0
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                t0 = time.time()
                try:
                    r = http.post(f"{url}/v1/chat/completions", json={"model": model, "messages": [
                        {"role": "user", "content": f"What is {n} plus {i}?"}]})
                    status, body = r.status_code, r.text[:300]
                except httpx.HTTPError as e:
                    status, body = -1, repr(e)
                results.append({"t0": t0, "s": time.time() - t0, "model": model, "status": status, "body": body})
                n += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.time() + 60
    while sum(r["status"] == 200 for r in results) < 40 and time.time() < deadline:
        time.sleep(0.2)
    before = set(_model_replicas())
    assert len(before) == len(models), before
    killed_at = time.time()
    for name in before:
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)  # Serve's controller starts another
    deadline = time.time() + 120  # a bound on a hang: it ends as soon as every model has a new replica
    while time.time() < deadline:
        now = set(_model_replicas())
        if len(now - before) == len(models) and sum(r["status"] == 200 and r["t0"] > time.time() - 1
                                                    for r in results) >= 8:
            break
        time.sleep(0.5)
    replaced_s = time.time() - killed_at
    time.sleep(2)  # a little load on the new replicas
    stop.set()
    for t in threads:
        t.join()
    after = [r for r in results if r["t0"] + r["s"] >= killed_at]
    counts = collections.Counter(r["status"] for r in after)
    longest = max(r["s"] for r in after)
    print(f"\nevery model replica killed: {len(after)} requests during and after ({dict(counts)}), the longest "
          f"{longest:.1f} s; new replicas within {replaced_s:.1f} s")
    assert len(set(_model_replicas()) - before) == len(models)
    assert counts[200] == len(after), [r["body"] for r in after if r["status"] != 200][:5]


def test_a_replica_whose_constructor_runs_is_coming_and_one_with_no_room_is_not(demo):
    """Serve learns a replica's node only once its constructor is done — a vLLM engine loads for a minute or more on
    a CPU — and a cluster that the replica fills has no room for another: the liveness check still counts it as
    coming (its actor has a worker process of its own on a live node, in the GCS's actor table), so a request naming
    its model waits for it instead of a 503; a replica that waits for resources no node has is not coming."""
    import ray
    from ray import serve

    from proxray.serve.deployments.liveness import constructed_on, replica_coming

    cpus = ray.available_resources().get("CPU", 0.0)
    assert cpus >= 0.5

    # every free CPU: no room for one more once placed; deleted mid-constructor at the end, it is killed after 1 s
    # (Serve's default: 20 s for a replica to finish what it was doing)
    @serve.deployment(ray_actor_options={"num_cpus": cpus}, graceful_shutdown_timeout_s=1)
    class Loading:
        def __init__(self):
            time.sleep(60)

        def __call__(self, request):
            return "loaded"

    # never placed: Serve's default would wait 20 s for it to finish before giving it up when the app is deleted
    @serve.deployment(ray_actor_options={"num_cpus": 0, "resources": {"no_such_node": 1}},
                      graceful_shutdown_timeout_s=1)
    class Roomless:
        def __call__(self, request):
            return "never"

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
    class Front:
        def __init__(self, a, b):
            self.a, self.b = a, b

    from ray.serve.api import _run  # serve.run waits for the app to run: deployed, not waited for

    _run(Front.bind(Loading.bind(), Roomless.bind()), name="starting", route_prefix="/starting", _blocking=False)
    try:
        def states():
            deps = serve.status().applications.get("starting")
            return {} if deps is None else {n: d.replica_states for n, d in deps.deployments.items()}

        deadline = time.monotonic() + 120
        seen = {}
        while time.monotonic() < deadline:
            seen = states()
            constructing = [a for a in ray.util.list_named_actors(all_namespaces=True)
                            if a["name"].startswith("SERVE_REPLICA::starting#Loading#")]
            # placed: its actor has a worker process (not any CPU taken: the other app's replicas may still move)
            if seen.get("Loading", {}).get("STARTING") and seen.get("Roomless", {}).get("STARTING") and constructing \
                    and constructed_on("starting", "Loading"):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the replicas did not start: {seen}")
        assert replica_coming("starting", "Loading") is True
        assert replica_coming("starting", "Roomless") is False
        # Serve's replica actor is alive within a second and runs the constructor after: still coming then
        from ray._private.state import state

        while time.monotonic() < deadline and not [
                a for a in state.actor_table(None, job_id=None, actor_state_name="ALIVE").values()
                if str(a.get("Name")).startswith("SERVE_REPLICA::starting#Loading#")]:
            time.sleep(0.2)
        assert states()["Loading"].get("STARTING") and replica_coming("starting", "Loading") is True
    finally:
        serve.delete("starting", _blocking=False)
