"""Drift monitor: watches routed traffic, labels what the router was not trained for with the pool and
a judge, measures true J_z on shadow-evaluated traffic, and grows the router live.

* ``config``: ``MonitorConfig`` (``monitor.yaml``)
* ``core``: ``DriftMonitor``, the decisions and the scheduler
* ``state``: snapshot + journal checkpoints
* ``jobs``: the evaluation job through the Ray Jobs API (exactly-once submission ids) or inline
* ``actor``: the detached actor (``start_monitor`` / ``get_monitor`` / ``stop_monitor``)
"""
from importlib import import_module

# what the package offers, by the module that holds it: imported when first asked for, so that a command that only
# finds the running monitor (``proxray monitor status``) does not import the evaluation job's config and pandas
_WHERE = {"DriftMonitor": "core", "text_key": "core", "MonitorConfig": "config", "load_monitor_config": "config",
          "start_monitor": "actor", "get_monitor": "actor", "stop_monitor": "actor"}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"proxray.monitor.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'proxray.monitor' has no attribute {name!r}")
