"""``proxray serve`` stopped as a supervisor stops it (SIGTERM, to it or to its whole process group as systemd and
``kill -TERM -- -PGID`` do) or as a person does (Ctrl-C: SIGINT to the group) leaves nothing behind: when it exits,
its HTTP port and Serve's HAProxy stats and metrics ports are free and no HAProxy it started still runs, so the next
``proxray serve`` starts on the same port. A local cluster of Ray on 127.0.0.1, bounded in time."""
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import yaml

import background
from serve_helpers import WEAK, STRONG, fit_router
from proxray.serve.front import free_port

pytestmark = pytest.mark.slow


def free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def haproxies() -> list:
    """The HAProxy processes this test process's clusters may have started: every one on the machine but those of the
    suite's background work (tests/background.py), or, where the suite runs in two workers (each with its own Ray
    temp folder), those that inherited this worker's."""
    mine = f"RAY_TMPDIR={os.environ['RAY_TMPDIR']}".encode() if os.environ.get("PYTEST_XDIST_WORKER") else None
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if cmd and os.path.basename(cmd[0].decode(errors="replace")).endswith("haproxy"):
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
                if mine is not None and mine not in environ or \
                        any(v.startswith(f"{background.MARK}=".encode()) for v in environ):
                    continue
                out.append(int(pid))
        except OSError:
            continue
    return out


def stopped(tmp_path, argv: list, port: int, ready, stops) -> list:
    """Starts ``proxray <argv>`` on ``port``, waits until ``ready(log_text)`` and /health answers 200 and stops it, once
    per ``(signal, to the whole process group)`` of ``stops``: after each stop no HAProxy it started runs and its ports
    are free."""
    stats, metrics = free_port(), free_port()
    env = {**os.environ, "RAY_SERVE_HAPROXY_STATS_PORT": str(stats), "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics)}
    before, seen = set(haproxies()), []
    for i, (how, group) in enumerate(stops):
        path = tmp_path / f"{argv[0]}-{i}-{how.name}.log"
        with open(path, "w") as log:
            running = subprocess.Popen([sys.executable, "-m", "proxray", *argv], stdout=log, stderr=subprocess.STDOUT,
                                       env=env, start_new_session=True)
        try:
            for _ in range(600):  # up to 5 minutes for the first answer
                assert running.poll() is None, path.read_text()[-3000:]
                try:
                    if ready(path.read_text()) and \
                            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            else:
                raise AssertionError(f"proxray {argv[0]} did not answer /health")
            assert set(haproxies()) - before  # Serve's HAProxy ingress is in front
            if group:
                os.killpg(running.pid, how)  # its own session: the group is it and what it started in it
            else:
                running.send_signal(how)
            assert running.wait(90) == 0, path.read_text()[-3000:]
        finally:
            if running.poll() is None:
                os.killpg(running.pid, signal.SIGKILL)
        left = set(haproxies()) - before
        seen.append({"signal": how.name, "group": group, "haproxy_left": len(left),
                     "ports_free": [free(p) for p in (port, stats, metrics)]})
        print(seen[-1])
        assert not left and free(port) and free(stats) and free(metrics)
    return seen


def test_proxray_serve_stopped_three_times_leaves_its_ports_free_and_starts_again(tmp_path, encoder):
    """SIGTERM to it, SIGTERM to its process group and SIGINT to the group. The races a group signal can meet —
    HAProxy's parent gone before the stop looks, a HAProxy started while it goes on — happen every time in
    tests/test_supervise.py."""
    fit_router(tmp_path / "router", encoder, [WEAK, STRONG])
    port = free_port()
    config = {"proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": port},
              "applications": [{"name": "proxray", "route_prefix": "/", "import_path": "proxray.serve.app:build_app",
                                "args": {"router": str(tmp_path / "router"), "timeout_s": 10, "models": [
                                    {"id": m, "engine": "sim", "autoscaling": {"min_replicas": 1, "max_replicas": 1}}
                                    for m in (WEAK, STRONG)]}}]}
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    stops = [(signal.SIGTERM, False), (signal.SIGTERM, True), (signal.SIGINT, True)]
    stopped(tmp_path, ["serve", "--config", str(tmp_path / "serve.yaml")], port, lambda log: True, stops)


def test_proxray_demo_drift_stopped_twice_leaves_its_ports_free_and_starts_again(tmp_path):
    """The demo runs a local Ray, Serve with HAProxy and the monitor's CLI in its own process tree; stopped in the
    middle of its loop (right after it serves), by SIGTERM to its process group or SIGINT to it, nothing of it is
    left."""
    port = free_port()
    stopped(tmp_path, ["demo", "drift", "--n-per-task", "10", "--port", str(port)], port,
            lambda log: f"serving on http://127.0.0.1:{port}/v1" in log, [(signal.SIGTERM, True), (signal.SIGINT, False)])
