"""Where a launcher cluster's GCS keeps its tables in an external Redis (Ray's GCS fault tolerance), and removing them.

``cluster.yaml``'s head starts Ray with ``RAY_external_storage_namespace`` set to ``proxray-<boot id>`` (the host's
``/proc/sys/kernel/random/boot_id``, which a container shares) unless ``~/.proxray/env`` names one: a head restarted on
its instance (``ray up --restart-only``) finds its own tables again, and a head on a new instance (``ray down`` then
``ray up``) starts afresh instead of restoring the last cluster's actors — the detached drift monitor among them.
``clean`` removes one namespace's tables (what the guide's tear-down runs on the head before ``ray down``).
"""
from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
PREFIX = "proxray-"


def env_file_values(path: str | os.PathLike) -> dict:
    """``NAME=value`` lines of a shell environment file (``export`` allowed, quotes stripped); {} when absent."""
    out = {}
    try:
        lines = Path(os.path.expanduser(str(path))).read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        line = line.strip().removeprefix("export ").strip()
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            out[name.strip()] = value.strip().strip("'\"")
    return out


def namespace(env: dict, boot_id: Path = BOOT_ID) -> str:
    """The namespace the head's start command gives Ray: the one ``env`` names, else ``proxray-<boot id>``."""
    return env.get("RAY_external_storage_namespace") or PREFIX + boot_id.read_text().strip()


def redis_target(address: str) -> tuple:
    """``host:port``, ``redis://host:port`` or ``rediss://host:port`` (TLS) as (host, port, TLS or not)."""
    parsed = urllib.parse.urlparse(address if "://" in address else f"redis://{address}")
    if parsed.scheme not in ("redis", "rediss") or not parsed.hostname:
        raise ValueError(f"RAY_REDIS_ADDRESS: {address!r} is not host:port, redis://host:port or rediss://host:port")
    return parsed.hostname, parsed.port or 6379, parsed.scheme == "rediss"


def clean(env: dict, boot_id: Path = BOOT_ID) -> str:
    """Remove the GCS tables of ``namespace(env)`` from the Redis ``env`` names (``RAY_REDIS_ADDRESS``,
    ``RAY_REDIS_PASSWORD``, ``RAY_REDIS_USERNAME``); the namespace removed. Run with the head's Ray stopped."""
    address = env.get("RAY_REDIS_ADDRESS")
    if not address:
        raise ValueError("RAY_REDIS_ADDRESS: not set (in the environment or the env file): no external Redis to clean")
    from ray._private.gcs_utils import cleanup_redis_storage

    host, port, tls = redis_target(address)
    ns = namespace(env, boot_id)
    if not cleanup_redis_storage(host, port, env.get("RAY_REDIS_PASSWORD", ""), tls, ns,
                                 username=env.get("RAY_REDIS_USERNAME") or None):
        raise RuntimeError(f"the Redis at {host}:{port} did not remove namespace {ns!r}")
    return ns
