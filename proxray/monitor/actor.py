"""The monitor as a named, detached Ray actor that runs itself: ``start_monitor`` creates it (or finds
it) and its scheduler thread starts in the constructor, so an actor Ray restarts after a crash restores
its checkpoint and goes on by itself.

It runs on the cluster's head node, as Ray's own controllers do: the Jobs API it submits evaluations to is
the head's dashboard, whose address Ray records as the head sees it (``127.0.0.1:8265`` when the dashboard
listens on the head's localhost only, as ``cluster.yaml`` keeps it). It asks for no CPU, so a head that
runs no tasks (``CPU: 0``) still places it."""
from __future__ import annotations

from proxray.common.actors import NAMESPACE, ActorDown, call, find, get_or_create  # noqa: F401 - NAMESPACE re-exported
HEAD_NODE_RESOURCE = "node:__internal_head__"  # Ray's resource that only the head node has


def placement() -> dict:
    """The monitor's Ray options: on the head node (a sliver of the resource only it has), no CPU."""
    return {"num_cpus": 0, "resources": {HEAD_NODE_RESOURCE: 0.001}}


def start_monitor(config, name: str | None = None, **ray_options):
    """The monitor actor for ``config`` (``MonitorConfig`` or a dict), started once: an actor of that name
    that already runs is returned as it is."""
    import ray

    from proxray.monitor.config import MonitorConfig
    from proxray.monitor.core import DriftMonitor

    cfg = config if isinstance(config, MonitorConfig) else MonitorConfig.model_validate(config)
    opts = {**placement(), **ray_options}
    actor_cls = ray.remote(max_restarts=-1, max_task_retries=-1, **opts)(DriftMonitor)
    return get_or_create(actor_cls, name or cfg.name, cfg.model_dump(mode="json", exclude_none=True), None, True)


def get_monitor(name: str = "proxray-monitor"):
    """The running monitor named ``name``, or None."""
    return find(name)


def stop_monitor(name: str = "proxray-monitor") -> bool:
    """Stop the scheduler (final checkpoint), then end the actor for good. False if there was none."""
    import ray

    actor = get_monitor(name)
    if actor is None:
        return False
    try:
        call(actor, name, "stop", timeout_s=60.0)
    except ActorDown:  # gone or stuck: ended below all the same
        pass
    finally:
        ray.kill(actor, no_restart=True)
    return True
