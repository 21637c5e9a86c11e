"""Two network namespaces joined by a veth pair: two "machines" on this one, each with its own loopback, the head at
10.<a>.<b>.1 and the worker at .2. Processes started in one (``run``/``popen``) see only its 127.0.0.1; ``close``
kills every process left in them and removes them. Needs CAP_NET_ADMIN (root in CI's container)."""
from __future__ import annotations

import os
import signal
import subprocess
import time


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class TwoHosts:
    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.head, self.worker = f"pxh{tag}", f"pxw{tag}"
        octet = 16 + os.getpid() % 200
        self.head_ip, self.worker_ip = f"10.213.{octet}.1", f"10.213.{octet}.2"
        made = []
        try:
            for ns in (self.head, self.worker):
                _ip("netns", "add", ns)
                made.append(ns)
            _ip("link", "add", f"{self.head}v", "type", "veth", "peer", "name", f"{self.worker}v")
            for ns, ip in ((self.head, self.head_ip), (self.worker, self.worker_ip)):
                _ip("link", "set", f"{ns}v", "netns", ns)
                _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", f"{ns}v")
                _ip("-n", ns, "link", "set", f"{ns}v", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except Exception:
            for ns in made:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            raise

    @staticmethod
    def available() -> str | None:
        """None when namespaces can be made here, else why not."""
        probe = f"pxprobe{os.getpid() % 100000}"
        r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if r.returncode:
            return f"ip netns add: {r.stderr.strip() or r.returncode}"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return None

    def run(self, ns: str, cmd: list, env: dict, timeout_s: float = 300, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", ns, *cmd], env=env, capture_output=True, text=True,
                              timeout=timeout_s, **kw)

    def pids(self, ns: str) -> list:
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]

    def kill(self, ns: str) -> int:
        """SIGKILL every process in ``ns`` (a machine lost without a drain); how many there were."""
        pids = self.pids(ns)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.time() + 15
        while time.time() < deadline and self.pids(ns):
            time.sleep(0.2)
        return len(pids)

    def close(self) -> None:
        for sig, grace_s in ((signal.SIGTERM, 3), (signal.SIGKILL, 15)):  # a cleanup: what SIGTERM leaves is killed
            for ns in (self.head, self.worker):
                for pid in self.pids(ns):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
            deadline = time.time() + grace_s
            while time.time() < deadline and (self.pids(self.head) or self.pids(self.worker)):
                time.sleep(0.5)
        for ns in (self.head, self.worker):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
