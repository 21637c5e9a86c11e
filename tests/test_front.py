"""How HTTP reaches the ingress (proxray.serve.front): Serve's HAProxy ingress, the front proxray's clusters run and
these tests' clusters too (conftest), ready only when it routes. (Serve's Python proxy, which a caller may keep, is
measured beside it by bench/bench_gateways.py --front proxy.)"""
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from proxray.serve.front import FRONT, front_env
from serve_helpers import KEY, STRONG, WEAK, fit_router, free_port


def test_the_front_is_haproxy_unless_the_callers_environment_says_otherwise():
    assert front_env({}) == {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
    assert front_env({"RAY_SERVE_ENABLE_HA_PROXY": "0"}) == {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
    assert all(os.environ.get(name) == value for name, value in FRONT.items())  # the tests run what users run


def _listeners():
    """{port: process title} of what listens on TCP here."""
    import psutil

    return {c.laddr.port: " ".join(psutil.Process(c.pid).cmdline()) for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.pid}


@pytest.mark.slow
def test_health_says_200_only_once_the_routes_answer(tmp_path, encoder, monkeypatch):
    """Deployed while a probe asks /health every 20 ms: the moment it first says 200, 24 chat completions go at once,
    and every one is answered — none refused for a missing route (404) or a backend not up yet (503)."""
    import ray
    from ray import serve

    from proxray.serve.app import build_app

    monkeypatch.setenv("PROXRAY_TEST_KEY", KEY)
    fit_router(tmp_path / "router", encoder, [WEAK, STRONG])
    one = {"min_replicas": 1, "max_replicas": 1}
    models = [{"id": m, "engine": "sim", "autoscaling": one} for m in (WEAK, STRONG)]
    port = free_port()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        url = f"http://127.0.0.1:{port}"
        before, done = [], threading.Event()

        def deploy():
            serve.run(build_app({"router": str(tmp_path / "router"), "models": models,
                                 "api_key_env": "PROXRAY_TEST_KEY"}), name="proxray", route_prefix="/")
            done.set()

        threading.Thread(target=deploy, daemon=True).start()
        probe = httpx.Client(timeout=5)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                status = probe.get(f"{url}/health").status_code
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
        from collections import Counter

        print(f"/health before its first 200: {dict(Counter(before))}")
        listening = _listeners()
        assert "haproxy" in listening[port], listening.get(port)  # Serve's HAProxy ingress answered, not its proxy
        # the ingress replica's own port, behind HAProxy: the key is checked in the replica, so the port is no way round
        own = [p for p, name in listening.items() if 30000 <= p <= 31000 and "RouterIngress" in name]
        assert own, {p: n for p, n in listening.items() if p >= 30000}
        assert httpx.post(f"http://127.0.0.1:{own[0]}/v1/chat/completions", json=body, timeout=60).status_code == 401
        assert client.post(f"http://127.0.0.1:{own[0]}/v1/chat/completions", json=body).status_code == 200
        assert done.wait(120)
    finally:
        serve.shutdown()
        ray.shutdown()
