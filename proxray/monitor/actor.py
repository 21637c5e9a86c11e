"""The monitor as a named, detached Ray actor that runs itself: ``start_monitor`` creates it (or finds
it) and its scheduler thread starts in the constructor, so an actor Ray restarts after a crash restores
its checkpoint and goes on by itself."""
from __future__ import annotations

NAMESPACE = "proxray"


def start_monitor(config, name: str | None = None, **ray_options):
    """The monitor actor for ``config`` (``MonitorConfig`` or a dict), started once: an actor of that name
    that already runs is returned as it is."""
    import ray

    from proxray.monitor.config import MonitorConfig
    from proxray.monitor.core import DriftMonitor

    cfg = config if isinstance(config, MonitorConfig) else MonitorConfig.model_validate(config)
    opts = {"num_cpus": 0.5, **ray_options}
    actor_cls = ray.remote(max_restarts=-1, max_task_retries=-1, **opts)(DriftMonitor)
    return actor_cls.options(name=name or cfg.name, namespace=NAMESPACE, lifetime="detached",
                             get_if_exists=True).remote(cfg.model_dump(), None, True)


def get_monitor(name: str = "proxray-monitor"):
    import ray

    return ray.get_actor(name, namespace=NAMESPACE)


def stop_monitor(name: str = "proxray-monitor") -> bool:
    """Stop the scheduler (final checkpoint), then end the actor for good. False if there was none."""
    import ray

    try:
        actor = get_monitor(name)
    except ValueError:
        return False
    try:
        ray.get(actor.stop.remote(), timeout=60)
    finally:
        ray.kill(actor, no_restart=True)
    return True
