"""Start a real Serve app on 127.0.0.1 for tests: a kNN router over a small synthetic table and
simulated model deployments."""

from pathlib import Path

import numpy as np

from proxray import KNNRouter, RoutingTable
from proxray.data.synthetic import generate_queries
from proxray.serve.front import NODE_PORTS, free_port, node_ports

TESTS = Path(__file__).resolve().parent
WEAK, STRONG = "meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.3-70B-Instruct"
SLOW, BROKEN = "google/gemma-7b-it", "microsoft/Phi-3-small-8k-instruct"
KEY = "sk-test-not-a-real-key-123"


def node_front(env_vars: dict | None = None) -> dict:
    """``env_vars`` for a node added to a many-node Ray cluster on this one machine, with its own ports for Serve's
    HAProxy ingress (HTTP, stats, metrics) and fallback proxy, as each node of a real cluster has them on its own
    machine: without them its HAProxy cannot bind the head's and fails over and over."""
    return {**(env_vars or {}), "RAY_SERVE_WORKER_PROXY_HTTP_PORT": str(free_port()), **node_ports()}


# model -> (probability of a right answer, cost per query): BROKEN looks best and cheap to the router,
# STRONG good and dear, WEAK cheap and poor.
PROFILE = {WEAK: (0.3, 1e-6), SLOW: (0.5, 4e-6), BROKEN: (1.0, 2e-6), STRONG: (0.9, 3e-5)}


def fit_router(path, encoder, models, profile=None, table_path=None):
    """A kNN router over a small synthetic table, saved at ``path``; ``table_path``: the table it was fitted on is
    written there too (a monitor's ``table``: it embeds 32 prompts, not the embedded table's 2,000)."""
    profile = {**PROFILE, **(profile or {})}
    q = generate_queries(8, seed=1)
    rng = np.random.default_rng(0)
    n = len(q)
    acc = np.stack([rng.uniform(size=n) < profile[m][0] for m in models], 1).astype(float)
    cost = np.tile([profile[m][1] for m in models], (n, 1))
    table = RoutingTable.from_matrices(acc, cost, models=models, prompts=list(q.prompt), tasks=list(q.task),
                                       query_ids=list(q.query_id))
    if table_path is not None:
        table.write(table_path)
    KNNRouter(k=10).fit(encoder.encode(table.prompts), *table.matrices(models=models), models=models,
                        encoder_id=encoder.id, query_ids=list(q.query_id), tasks=list(q.task)).save(path)


def start_app(tmp, fit_encoder, models, request_timeout_s=60, app_name="proxray", profile=None, protocols=None,
              metrics_port=None, env=None, families=(), **args):
    """serve.run(build_app) on a Ray and Serve of this test process (started here where none runs, or where the one that
    runs was started for other settings), with a router fitted on ``fit_encoder``'s embeddings (``args``: the app's,
    ``encoder`` among them; ``request_timeout_s``: Serve's proxy answers 408 past it; ``protocols``: the app's protocol
    table, default the shipped one; ``families``: router families its replicas register; ``metrics_port``: Ray's
    Prometheus endpoint's, where a test scrapes it; ``env``: more environment for every worker); returns the base
    URL.
    ``stop_app`` deletes the app and what it left in Ray; the next module's ``start_app`` reuses the same Ray and Serve
    where its settings and the environment its workers inherit are the same (``_SHARED``)."""
    from ray import serve

    from proxray.serve.app import build

    fit_router(tmp / "router", fit_encoder, [m["id"] for m in models], profile)
    # a replica's heartbeat comes every 0.25 s, but on two cores shared with the suite's background work (each a Ray
    # of its own) its beats can pause for over a second, and the app's 1-s default then gives a live replica up (a
    # fallback, a route changed): a bound on a hang here, where a test bounds no failover (those set their own)
    args.setdefault("failover_s", 5.0)
    port = _serve_for(request_timeout_s, metrics_port, env)
    serve.run(build({"router": str(tmp / "router"), "models": models, **args}, protocols, families), name=app_name,
              route_prefix="/")
    return f"http://127.0.0.1:{port}"


# The Ray and Serve that start_app started and stop_app left running: {"key": what they were started with, "port": Serve's
# HTTP port}. Starting and stopping them costs ~11 s a module; deleting an app ~3 s.
_SHARED: dict = {}
# what changes from test to test without reaching a worker: HAProxy's ports are bound when Serve starts; LiteLLM's
# import sets its tokenizers' folder (no worker imports it)
_NOT_INHERITED = {"PYTEST_CURRENT_TEST", "TIKTOKEN_CACHE_DIR", *NODE_PORTS}


def _serve_for(request_timeout_s, metrics_port, env) -> int:
    import os

    import ray
    from ray import serve

    # every worker can import the tests' own modules (a toy protocol, a router family): one Ray serves those modules too
    env = {"PYTHONPATH": str(TESTS), **(env or {})}

    def key():  # Ray's start sets variables of its own in this process's environment: compared after it
        return (request_timeout_s, metrics_port, tuple(sorted(env.items())),
                tuple(sorted((k, v) for k, v in os.environ.items() if k not in _NOT_INHERITED)))

    if _SHARED.get("key") == key() and ray.is_initialized():
        return _SHARED["port"]
    release()
    port = free_port()
    # a Ray whose metrics a test reads exports them every second (Ray's default: every 10 s)
    system = {"metrics_report_interval_ms": 1000} if metrics_port else None
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, _metrics_export_port=metrics_port,
             _system_config=system,
             runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled", **env}})  # the API key comes from the environment, never the runtime env
    http = {"host": "127.0.0.1", "port": port}
    if request_timeout_s:
        http["request_timeout_s"] = request_timeout_s  # the proxy answers (408) instead of holding a request forever
    serve.start(http_options=http)
    _SHARED.update(key=key(), port=port, cpus=ray.available_resources().get("CPU", 0.0))
    return port


def ray_address() -> str:
    """The GCS address of the Ray this process is connected to: what a CLI run from a test names with ``--address``
    (``auto`` may find another Ray on the machine: one of another test worker)."""
    import ray

    return ray.get_runtime_context().gcs_address


def release():
    """Serve and Ray stopped where start_app left them running (before a module that starts its own)."""
    import ray
    from ray import serve

    if _SHARED.pop("key", None) is not None and ray.is_initialized():
        serve.shutdown()
        ray.shutdown()
        _no_ingress_left()


def _no_ingress_left(timeout_s=20.0):
    """Wait until no process listens on this process's block of ingress replica ports (the Ray just stopped had its
    replicas there): the next Ray's Serve hands the same ports out again, and a replica of the old app still bound to one
    (Serve binds them with SO_REUSEPORT) would share the new app's connections. One still listening after
    ``timeout_s`` is named on stderr and killed."""
    import os
    import signal
    import sys
    import time

    from journey import listeners
    from proxray.serve.front import INGRESS_RANGES, listening_ports

    low = int(os.environ.get("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", INGRESS_RANGES["HTTP"][0]))
    high = int(os.environ.get("RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT", INGRESS_RANGES["HTTP"][1]))

    def held():  # where the kernel's tables cannot be read (not Linux): nothing to wait for
        return sorted(port for port in listening_ports() or () if low <= port <= high)

    deadline = time.monotonic() + timeout_s
    while (left := held()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for port in left:
        for proc in listeners(port):
            print(f"serve_helpers: {proc} still listens on ingress port {port} of a stopped Ray after {timeout_s:.0f} s:"
                  " killed", file=sys.stderr)
            try:
                os.kill(proc["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def seen(model, app_name="proxray", asks=1):
    """The last request the model's deployment received: what the gateway passed through to it. ``asks``: how many
    times to ask, each asked replica's newest counting (a deployment of more than one replica spreads the asks)."""
    from ray import serve

    from proxray.serve.app import deployment_name

    handle = serve.get_deployment_handle(deployment_name(model), app_name)
    return max((r for _ in range(asks) for r in handle.seen.remote().result()), key=lambda r: r["at"])


def ends(model, app_name="proxray", asks=1):
    """How the model deployment's calls ended (``OpenAIModel.ends``), oldest first (``asks``: as ``seen``'s, the
    calls of every replica asked)."""
    from ray import serve

    from proxray.serve.app import deployment_name

    handle = serve.get_deployment_handle(deployment_name(model), app_name)
    calls = {(e["at"], e["endpoint"]): e for _ in range(asks) for e in handle.ends.remote().result()}
    return [calls[k] for k in sorted(calls)]


def stop_app():
    """The test's apps deleted, with the named actors and checkpoints they left (proxray's namespace), and every CPU
    they held free again: the next start_app finds Ray and Serve as a fresh start leaves them (where they do not free
    them within a minute, both stopped). Where start_app did not start them, both stopped."""
    import time

    import ray
    from ray import serve
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_list

    from proxray.common.actors import NAMESPACE

    if _SHARED.get("key") is None or not ray.is_initialized():
        serve.shutdown()
        ray.shutdown()
        return
    try:
        for name in list(serve.status().applications):
            serve.delete(name)
        # the replicas gone first: a stopping replica gives its keys' leases back and sends its last charges to the
        # app's ledger (creating it anew where it is gone), which must not outlive the app into the next module's
        deadline = time.monotonic() + 60
        while _replicas_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        while time.monotonic() < deadline:  # every actor and checkpoint gone, a checkpoint written late included
            named = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]
            kept = _internal_kv_list(b"", namespace=NAMESPACE)
            if not named and not kept:
                break
            for actor in named:
                try:
                    ray.kill(ray.get_actor(actor, namespace=NAMESPACE), no_restart=True)
                except ValueError:  # gone meanwhile
                    pass
            for k in kept:
                _internal_kv_del(k, namespace=NAMESPACE)
            time.sleep(0.1)
        deadline = time.monotonic() + 60  # replicas and actors stop after the calls above return
        while ray.available_resources().get("CPU", 0.0) < _SHARED["cpus"] and time.monotonic() < deadline:
            time.sleep(0.1)
        if ray.available_resources().get("CPU", 0.0) < _SHARED["cpus"]:
            release()
    except Exception:  # anything left half-deleted: the next start_app starts afresh
        release()
        raise


def _replicas_alive() -> bool:
    """Whether a Serve replica of an application still runs in this Ray (Serve names each one
    ``SERVE_REPLICA::<app>#<deployment>#<id>``; its controller and proxies aside)."""
    import ray

    return any(a["name"].startswith("SERVE_REPLICA::") for a in ray.util.list_named_actors(all_namespaces=True))


def ledger(name, app_name="proxray"):
    """The keys ledger's report of key ``name`` once nothing it holds is unsettled (settles follow the answers)."""
    import time

    import ray

    try:
        ray.get_actor(f"proxray-keys-{app_name}", namespace="proxray")
    except ValueError:  # no request yet
        return {"spent_usd": 0.0, "held_usd": 0.0}
    for _ in range(200):  # settles are sent after the answers: wait until nothing is held
        rep = ray.get(ray.get_actor(f"proxray-keys-{app_name}", namespace="proxray").report.remote()).get(name)
        if rep is None:  # never admitted: nothing spent or held
            return {"spent_usd": 0.0, "held_usd": 0.0}
        if rep["held_usd"] == 0:
            return rep
        time.sleep(0.05)
    raise AssertionError(f"{name}: holds never settled: {rep}")


def kill_under_load(actor, seen, ready, answered, settle_s, before_kill=None, window=8) -> float:
    """Kill the app's shared actor named ``actor`` (namespace proxray) under the load whose threads append entries
    ``(monotonic time, …)`` to ``seen``: once ``ready(seen)`` holds (20 s at most; ``before_kill()`` runs just before),
    then wait until one of the last ``window`` entries, made more than 0.5 s after the kill, is ``answered(entry)``
    (30 s at most), and ``settle_s`` more while the load goes on. Returns when it was killed (monotonic)."""
    import time

    import ray

    for _ in range(400):
        if ready(seen):
            break
        time.sleep(0.05)
    if before_kill is not None:
        before_kill()
    ray.kill(ray.get_actor(actor, namespace="proxray"))
    killed = time.monotonic()
    for _ in range(600):
        if any(e[0] > killed + 0.5 and answered(e) for e in seen[-window:]):
            break
        time.sleep(0.05)
    time.sleep(settle_s)
    return killed


def kill_node(node) -> int:
    """SIGKILL every process of a ``ray.cluster_utils.Cluster`` node (no drain, no goodbye): its raylet (and a head's
    GCS), its agents and the workers under them; waits until they are gone. How many there were."""
    import signal

    import psutil

    procs = []
    for infos in node.all_processes.values():
        for info in infos:
            try:
                p = psutil.Process(info.process.pid)
                procs += [p, *p.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)
    return len(procs)


def prefix_cache(scrape: str, model: str) -> dict:
    """vLLM's prefix-cache counters for ``model`` on Ray's Prometheus endpoint ``scrape``, summed over its replicas:
    {"queries": prompt tokens looked up, "hits": found cached}."""
    import httpx

    out = {"queries": 0.0, "hits": 0.0}
    for ln in httpx.get(scrape, timeout=10).text.splitlines():
        for k in out:
            if ln.startswith(f"ray_vllm_prefix_cache_{k}_total{{") and f'model_name="{model}"' in ln:
                out[k] += float(ln.rsplit(" ", 1)[1])
    return out
