"""Drift monitor: watches routed traffic, labels what the router was not trained for with the pool and
a judge, measures true J_z on shadow-evaluated traffic, and grows the router live.

* ``config``: ``MonitorConfig`` (``monitor.yaml``)
* ``core``: ``DriftMonitor``, the decisions and the scheduler
* ``state``: snapshot + journal checkpoints
* ``jobs``: the evaluation job through the Ray Jobs API (exactly-once submission ids) or inline
* ``actor``: the detached actor (``start_monitor`` / ``get_monitor`` / ``stop_monitor``)
"""
from proxray.monitor.actor import get_monitor, start_monitor, stop_monitor
from proxray.monitor.config import MonitorConfig, load_monitor_config
from proxray.monitor.core import DriftMonitor, text_key

__all__ = ["DriftMonitor", "MonitorConfig", "load_monitor_config", "start_monitor", "get_monitor", "stop_monitor",
           "text_key"]
