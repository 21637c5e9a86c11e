"""Drift monitor: watches routed traffic, labels what the router was not trained for with the pool and
a judge, measures true J_z on shadow-evaluated traffic, and grows the router live.

* ``config``: ``MonitorConfig`` (``monitor.yaml``)
* ``core``: ``DriftMonitor``, the decisions and the scheduler
* ``state``: snapshot + journal checkpoints
* ``jobs``: the evaluation job through the Ray Jobs API (exactly-once submission ids) or inline
* ``actor``: the detached actor (``start_monitor`` / ``get_monitor`` / ``stop_monitor``)
"""
from proxray.common.lazy import lazy_exports

# imported when first asked for, so that a command that only finds the running monitor (``proxray monitor status``)
# does not import the evaluation job's config and pandas
_EXPORTS = {"DriftMonitor": "proxray.monitor.core", "text_key": "proxray.monitor.core",
            "MonitorConfig": "proxray.monitor.config", "load_monitor_config": "proxray.monitor.config",
            "start_monitor": "proxray.monitor.actor", "get_monitor": "proxray.monitor.actor",
            "stop_monitor": "proxray.monitor.actor"}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
