"""Autoscaling on routed load, on a two-node Ray cluster on this machine (not a timed test).

    python bench/bench_autoscale.py [--load-s 20] [--concurrency 8] [--json out/autoscale.json] [--plot docs/figures/autoscale_cluster.png]

Starts ``ray.cluster_utils.Cluster`` (a head and a worker node, 2 CPUs each) and the routed app with two simulated
models; the dear one answers in 0.4 s and autoscales 1 → 2 replicas (target 1 ongoing request, at most one replica
per node). Routed requests restricted to it (``proxray.allowed_models``) arrive with ``--concurrency`` client threads
for ``--load-s`` seconds between two idle spells; every 0.5 s the replicas of its deployment are counted per node
(the GCS's actor table). Writes the timeline as JSON and, with ``--plot``, a picture: requests answered per second
over time against the replicas on each node.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # the cluster this script starts for itself
CHEAP, DEAR = "meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.3-70B-Instruct"


def start(tmp: str):
    """The two-node cluster and the app on it: (chat URL, {node id: "head" / "worker"}, stop())."""
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from proxray import KNNRouter, SentenceEncoder
    from proxray.pool.simulated import make_table
    from proxray.serve.app import build_app

    table = make_table(40)
    enc = SentenceEncoder()
    KNNRouter(k=30).fit(enc.encode(table.prompts), *table.matrices(models=[CHEAP, DEAR]), models=[CHEAP, DEAR],
                        encoder_id=enc.id).save(f"{tmp}/router")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    worker = c.add_node(num_cpus=2)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    dear = {"id": DEAR, "engine": "sim", "engine_kwargs": {"latency_s": 0.4}, "max_replicas_per_node": 1,
            "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1, "upscale_delay_s": 0.5,
                            "downscale_delay_s": 3, "metrics_interval_s": 0.5, "look_back_period_s": 1}}
    serve.run(build_app({"router": f"{tmp}/router", "models": [{"id": CHEAP, "engine": "sim"}, dear]}),
              name="proxray", route_prefix="/")

    def stop():
        serve.shutdown()
        ray.shutdown()
        c.shutdown()

    return f"http://127.0.0.1:{port}/v1/chat/completions", {c.head_node.node_id: "head", worker.node_id: "worker"}, stop


def replicas_per_node(deployment: str, names: dict) -> dict:
    from ray._private.state import actors

    out = {n: 0 for n in names.values()}
    for a in actors().values():
        if a["ActorClassName"].endswith(f":{deployment}") and a["State"] == "ALIVE":
            out[names[a["Address"]["NodeID"]]] += 1
    return out


def run(url: str, names: dict, load_s: float, concurrency: int, idle_s: float = 5.0, after_s: float = 30.0) -> list:
    """The timeline: every 0.5 s {t, answered (in the last 0.5 s), errors, replicas per node}."""
    import httpx

    from proxray.serve.app import deployment_name

    name = deployment_name(DEAR)
    body = {"model": "proxray", "messages": [{"role": "user", "content": "Route me to the dear one."}],
            "proxray": {"allowed_models": [DEAR]}}
    answered, errors, lock, stop = [0], [0], threading.Lock(), threading.Event()
    client = httpx.Client(timeout=30)

    def worker():
        while not stop.is_set():
            try:
                ok = client.post(url, json=body).status_code == 200
            except httpx.HTTPError:
                ok = False
            with lock:
                (answered if ok else errors)[0] += 1

    timeline, t0, pool, last = [], time.time(), None, 0
    while (t := time.time() - t0) < idle_s + load_s + after_s:
        if pool is None and t >= idle_s:
            pool = ThreadPoolExecutor(concurrency)
            for _ in range(concurrency):
                pool.submit(worker)
        if pool is not None and t >= idle_s + load_s and not stop.is_set():
            stop.set()
        with lock:
            n, e = answered[0], errors[0]
        timeline.append({"t": round(t, 2), "answered": n - last, "errors": e, **replicas_per_node(name, names)})
        last = n
        time.sleep(0.5)
    stop.set()
    if pool is not None:
        pool.shutdown()
    return timeline


def plot(timeline: list, path: str, load: tuple) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [p["t"] for p in timeline]
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    a.plot(t, [2 * p["answered"] for p in timeline], color="tab:blue")
    a.axvspan(*load, color="tab:blue", alpha=0.08, label="routed load (8 client threads)")
    a.set_ylabel("requests answered / s")
    a.legend(loc="upper right", fontsize=8)
    a.set_title("Routed load on one model scales it out onto the other node and back (2-node Ray cluster)")
    b.step(t, [p["head"] for p in timeline], where="post", label="replicas on the head node", color="tab:green")
    b.step(t, [p["worker"] for p in timeline], where="post", label="replicas on the worker node", color="tab:orange",
           linestyle="--")
    b.axvspan(*load, color="tab:blue", alpha=0.08)
    b.set_yticks([0, 1, 2])
    b.set_ylabel("replicas")
    b.set_xlabel("seconds")
    b.legend(loc="upper right", fontsize=8)
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load-s", type=float, default=20.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    a = p.parse_args(argv)
    url, names, stop = start(tempfile.mkdtemp())
    try:
        timeline = run(url, names, a.load_s, a.concurrency)
    finally:
        stop()
    out = next((p["t"] for p in timeline if p["head"] >= 1 and p["worker"] >= 1), None)
    down = next((p["t"] for p in timeline if p["t"] > 5 + a.load_s and p["head"] + p["worker"] == 1), None)
    res = {"load_s": [5.0, 5.0 + a.load_s], "on_both_nodes_at_s": out, "back_to_one_at_s": down,
           "answered": sum(p["answered"] for p in timeline), "errors": timeline[-1]["errors"],
           "peak_rps": 2 * max(p["answered"] for p in timeline), "timeline": timeline}
    print(json.dumps({k: v for k, v in res.items() if k != "timeline"}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    if a.plot:
        plot(timeline, a.plot, (5.0, 5.0 + a.load_s))


if __name__ == "__main__":
    main()
