"""The drift monitor as a Serve application, for clusters that are declared rather than driven — KubeRay's
RayService, or any ``serve deploy``: one replica, no HTTP route, that starts the detached monitor actor from a
monitor config and starts it again when Serve's health check finds it gone (stopped for good, or lost with the
head). The monitor itself is the same actor ``proxray monitor start`` starts (on the head, its state on
``state_dir``): a restarted one restores its checkpoint.

    applications:
    - name: proxray-monitor
      route_prefix: null                       # no HTTP route: status through `proxray monitor status`
      import_path: proxray.monitor.app:build_app
      args: {config: /home/ray/proxray/monitor_configs/paper_pool_h100.yaml}
"""
from __future__ import annotations

from pydantic import Field

from proxray.common.yamlconfig import StrictModel


class MonitorAppArgs(StrictModel):
    """The application's ``args``."""
    config: str = Field(min_length=1, description="the monitor config (a path on every node, or a URI)")
    health_check_period_s: float = Field(30.0, gt=0, description="how often the replica checks that the monitor "
                                         "actor exists, and starts it when it does not")


class MonitorKeeper:
    """Keeps the named monitor actor of ``config`` alive: starts it (or finds it) now and on every health check."""

    def __init__(self, config: dict):
        from proxray.monitor.config import MonitorConfig

        self.config = MonitorConfig.model_validate(config)
        self.started = 0
        self.ensure()

    def ensure(self) -> None:
        from proxray.monitor.actor import get_monitor, start_monitor

        if get_monitor(self.config.name) is None:
            start_monitor(self.config)
            self.started += 1

    def check_health(self) -> None:
        self.ensure()
        self.export()

    def export(self) -> None:
        """The monitor's router versions and gate as Ray metrics (``ray_proxray_monitor_*`` on Ray's Prometheus
        endpoint, charted by the Grafana dashboard): served and candidate version, gate decisions, the last one with its
        reason, each label source's agreement and whether it is set aside."""
        import ray

        from proxray.monitor.actor import get_monitor
        from proxray.monitor.views import GateGauges

        monitor = get_monitor(self.config.name)
        try:
            status = ray.get(monitor.status.remote(), timeout=10) if monitor is not None else None
        except Exception:  # noqa: BLE001 - a monitor restarting: the next health check exports
            return
        if status is not None:
            self.gauges = getattr(self, "gauges", None) or GateGauges()
            self.gauges.set(status)

    def starts(self) -> int:
        """How many times this replica started the monitor actor (1 at first; more after it was gone)."""
        return self.started


def build_app(args: dict):
    """The Serve application: the monitor config read and validated here, at deploy time (a bad one fails the
    deploy, naming the field)."""
    from ray import serve

    from proxray.monitor.config import load_monitor_config

    a = MonitorAppArgs.model_validate(args)
    cfg = load_monitor_config(a.config)
    keeper = serve.deployment(MonitorKeeper, name="MonitorKeeper", num_replicas=1, max_ongoing_requests=4,
                              health_check_period_s=a.health_check_period_s, ray_actor_options={"num_cpus": 0})
    return keeper.bind(cfg.model_dump(mode="json", exclude_none=True))
