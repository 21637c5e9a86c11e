"""How HTTP reaches the ingress (proxray.serve.front): Serve's HAProxy ingress, the front proxray's clusters run and
these tests' clusters too (conftest), ready only when it routes. (Serve's Python proxy, which a caller may keep, is
measured beside it by bench/bench_gateways.py --front proxy.)"""
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from proxray.serve.front import FRONT, HAPROXY_PORTS, NODE_PORTS, PORT_CEILING, PORT_FLOOR, front_env, node_ports
from serve_helpers import KEY, STRONG, WEAK, fit_router, free_port


def test_the_front_is_haproxy_unless_the_callers_environment_says_otherwise():
    assert front_env({}) == {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
    assert front_env({"RAY_SERVE_ENABLE_HA_PROXY": "0"}) == {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
    assert all(os.environ.get(name) == value for name, value in FRONT.items())  # the tests run what users run
    local = front_env({}, local=True)
    ports = [int(local[name]) for name in NODE_PORTS]
    # not Ray's 8404 and 9101 (HAProxy's) nor 8500 and 9500 (the fallback proxy's, bound with SO_REUSEPORT)
    assert len(set(ports)) == 4 and all(PORT_FLOOR <= p < PORT_CEILING for p in ports)
    assert front_env({"RAY_SERVE_HAPROXY_STATS_PORT": "8404"}, local=True)["RAY_SERVE_HAPROXY_STATS_PORT"] == "8404"
    nodes = [node_ports() for _ in range(3)]  # each node of a many-node cluster on this machine: its own
    assert len({port for node in nodes for port in node.values()}) == 12


def test_free_ports_come_from_outside_the_range_every_connection_and_bind_0_draws_from(monkeypatch, tmp_path):
    """A port chosen now is bound later (HAProxy's, minutes later, after a job); the system's own choice sits in the
    ephemeral range, where outgoing connections and Ray's own servers take ports meanwhile."""
    import socket

    from proxray.serve import front

    ports = [free_port() for _ in range(300)]
    top = min(PORT_CEILING, int(front.EPHEMERAL_RANGE.read_text().split()[0]))  # Serve's replicas: 30000–31000
    assert len(set(ports)) == 300 and all(PORT_FLOOR <= p < top for p in ports)
    few = range(PORT_FLOOR, PORT_FLOOR + 20)  # a range where every port is taken: the system's choice
    held = [s for s in map(_hold, few) if s]
    try:
        (tmp_path / "range").write_text(f"{few.stop}\t60999\n")
        monkeypatch.setattr(front, "EPHEMERAL_RANGE", tmp_path / "range")
        port = front.free_port()
        assert port not in few
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    finally:
        for s in held:
            s.close()


def test_processes_given_ranges_of_their_own_never_choose_the_same_free_port(monkeypatch):
    """Two processes that start local clusters at once each choose ports that stay free until their process binds
    them, often a minute later: drawn from one range, both could choose the same one, and the app that binds it second
    finds the first one answering its requests. Given ranges of their own (PROXRAY_FREE_PORTS), they cannot."""
    from proxray.serve import front

    chosen = {}
    for name, ports in (("one", "24000-24049"), ("two", "24050-24099")):
        monkeypatch.setenv(front.FREE_PORTS, ports)
        chosen[name] = {front.free_port() for _ in range(40)}
    assert len(chosen["one"]) == len(chosen["two"]) == 40 and not chosen["one"] & chosen["two"]
    assert chosen["one"] <= set(range(24000, 24050)) and chosen["two"] <= set(range(24050, 24100))
    assert front.free_port_range({front.FREE_PORTS: " 24000-24000 "}) == range(24000, 24001)
    for bad in ("24000", "24100-24000", "80-90", "a-b", "24000-70000"):
        with pytest.raises(ValueError, match=f"PROXRAY_FREE_PORTS='{bad}': expected LOW-HIGH"):
            front.free_port_range({front.FREE_PORTS: bad})


def test_a_local_cluster_takes_ingress_ports_no_other_serve_on_the_machine_listens_on():
    """Serve's controller hands its ingress replicas ports from one range, lowest first, and they bind them with
    SO_REUSEPORT: two Serves on one machine on the same range would share ports and answer each other's requests. A
    cluster proxray starts here takes a block of the range on which nothing listens — here every block but one is
    held (one port in each, with SO_REUSEPORT as a replica holds it) — the same block of the gRPC range, and the
    ranges the caller's environment names where it names them. A port an outgoing connection holds is not one a
    Serve listens on."""
    import random
    import socket

    from proxray.serve.front import INGRESS_BLOCK, INGRESS_RANGES, ingress_ports, listening_ports

    (lo, hi), (glo, _) = INGRESS_RANGES["HTTP"], INGRESS_RANGES["GRPC"]
    listening = listening_ports()
    assert listening is not None  # Linux: the kernel's socket tables
    free = [o for o in range(0, hi - lo, INGRESS_BLOCK)  # what nothing on this machine listens on now
            if not listening & {p for first in (lo + o, glo + o) for p in range(first, first + INGRESS_BLOCK)}]
    assert free, "every block of Serve's ingress ranges is in use on this machine"
    free_block = random.Random(3).choice(free)
    held = []
    try:
        for offset in range(0, hi - lo, INGRESS_BLOCK):
            if offset == free_block:
                continue
            for port in random.Random(offset).sample(range(lo + offset, lo + offset + INGRESS_BLOCK), INGRESS_BLOCK):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                try:
                    s.bind(("127.0.0.1", port))
                    s.listen()
                    held.append(s)
                    break
                except OSError:  # something holds this one already (listening or not): the next
                    s.close()
        # an outgoing connection whose local port is in the free block's gRPC range (that range lies in the system's
        # ephemeral range: Ray's own connections land there) holds the port but listens on nothing: still free
        server = socket.create_server(("127.0.0.1", 0))
        client = socket.socket()
        client.bind(("127.0.0.1", glo + free_block + 7))
        client.connect(server.getsockname())
        held += [server, client]
        for seed in range(5):
            got = ingress_ports({}, rng=random.Random(seed))
            assert got == {"RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(lo + free_block),
                           "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(lo + free_block + INGRESS_BLOCK - 1),
                           "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(glo + free_block),
                           "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(glo + free_block + INGRESS_BLOCK - 1)}, got
    finally:
        for s in held:
            s.close()
    named = {"RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": "31000", "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": "31249"}
    assert ingress_ports(named) == named and front_env(named, local=True).items() >= named.items()
    # the tests' own clusters take ranges of their own, outside those blocks
    assert not lo <= int(os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]) < hi


def _hold(port: int):
    """A plain listener on ``port`` (another Serve's HAProxy, say), or None where something here holds it already."""
    import socket

    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
    except OSError:
        s.close()
        return None
    s.listen()
    return s


def _listeners():
    """{port: process title} of what listens on TCP here."""
    import psutil

    return {c.laddr.port: " ".join(psutil.Process(c.pid).cmdline()) for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.pid}


@pytest.mark.slow
def test_health_says_200_only_once_the_routes_answer(tmp_path, encoder, monkeypatch):
    """Deployed while a probe asks /health every 20 ms: the moment it first says 200, 24 chat completions go at once,
    and every one is answered — none refused for a missing route (404) or a backend not up yet (503) — and a request
    naming the model that starts last (a transformers engine loading its weights) is answered too; before, /health
    said 503 with how many models were still starting, or nothing (no route yet). Ray's own
    HAProxy stats and metrics ports (8404, 9101) and its fallback proxy's (8500, 9500) are held by another process
    meanwhile, as by a second Serve on the machine: a cluster started with ``front_env(local=True)`` takes others (a
    fallback proxy binds with SO_REUSEPORT: on another Serve's port it would answer that Serve's requests)."""
    import ray
    from ray import serve

    from proxray.serve.app import build_app

    monkeypatch.setenv("PROXRAY_TEST_KEY", KEY)
    for name in NODE_PORTS:
        monkeypatch.delenv(name, raising=False)
    for name, value in front_env(local=True).items():
        monkeypatch.setenv(name, value)
    held = [h for h in map(_hold, (8404, 9101, 8500, 9500)) if h is not None]
    from proxray.devtools import build_tiny_model

    weights = build_tiny_model(tmp_path / "tiny", seed=0)
    fit_router(tmp_path / "router", encoder, [WEAK, STRONG, "tiny"], profile={"tiny": (0.2, 1e-6)})
    one = {"min_replicas": 1, "max_replicas": 1}
    models = [{"id": m, "engine": "sim", "autoscaling": one} for m in (WEAK, STRONG)]
    models.append({"id": "tiny", "engine": "transformers", "source": str(weights), "num_cpus": 0.2, "autoscaling": one})
    port = free_port()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        url = f"http://127.0.0.1:{port}"
        before, starting, done = [], [], threading.Event()

        def deploy():
            serve.run(build_app({"router": str(tmp_path / "router"), "models": models,
                                 "api_key_env": "PROXRAY_TEST_KEY"}), name="proxray", route_prefix="/")
            done.set()

        threading.Thread(target=deploy, daemon=True).start()
        probe = httpx.Client(timeout=5)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                r = probe.get(f"{url}/health")
                status = r.status_code
                if status == 503 and r.headers.get("content-type") == "application/json":
                    starting.append(r.json())
            except httpx.HTTPError as e:
                status = type(e).__name__
            if status == 200:
                break
            before.append(status)
            time.sleep(0.02)
        assert status == 200, f"/health never said 200: {before[-5:]}"
        body = {"model": "proxray", "messages": [{"role": "user", "content": "What is 17 * 23?"}], "max_tokens": 8}
        client = httpx.Client(timeout=60, headers={"Authorization": f"Bearer {KEY}"})
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: client.post(f"{url}/v1/chat/completions", json=body).status_code,
                                  range(24)))
        assert codes == [200] * 24, (codes, before[-5:])
        named = client.post(f"{url}/v1/chat/completions", json={**body, "model": "tiny"})
        assert named.status_code == 200 and named.json()["model"] == "tiny", named.text[:300]
        assert all(s["status"] == "starting" and 1 <= s["models_starting"] <= 3 for s in starting), starting
        from collections import Counter

        print(f"/health before its first 200: {dict(Counter(before))}")
        listening = _listeners()
        assert "haproxy" in listening[port], listening.get(port)  # Serve's HAProxy ingress answered, not its proxy
        assert all("haproxy" in listening.get(int(os.environ[name]), "") for name in HAPROXY_PORTS), listening
        # the backup server of every HAProxy backend, Serve's fallback proxy: on the port named for this cluster
        assert "ProxyActor" in listening.get(int(os.environ["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"]), ""), listening
        # the ingress replica's own port, behind HAProxy: the key is checked in the replica, so the port is no way round
        # (its HTTP port: in the range this environment names; one in TIME_WAIT from an earlier run is skipped)
        http = range(int(os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]),
                     int(os.environ["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) + 1)
        own = [p for p, name in listening.items() if "RouterIngress" in name and p in http]
        assert len(own) == 1, {p: n for p, n in listening.items() if p >= 30000}
        assert httpx.post(f"http://127.0.0.1:{own[0]}/v1/chat/completions", json=body, timeout=60).status_code == 401
        assert client.post(f"http://127.0.0.1:{own[0]}/v1/chat/completions", json=body).status_code == 200
        assert done.wait(120)
    finally:
        serve.shutdown()
        ray.shutdown()
        for h in held:
            h.close()
