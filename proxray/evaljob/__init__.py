"""The evaluation job: a YAML config, the pool fanned out over Ray Data, grading, pricing, and per-query tables
written to any filesystem URI. ``proxray build-table`` and ``ray job submit`` run it; the drift monitor runs it
through this interface (``JobConfig``, ``load_config``, ``run_job``, ``graded_parts``)."""
from proxray.evaljob.config import ConfigError, JobConfig, load_config
from proxray.evaljob.consolidate import graded_parts
from proxray.evaljob.job import run_job
from proxray.evaljob.preflight import check_config

__all__ = ["ConfigError", "JobConfig", "check_config", "graded_parts", "load_config", "run_job"]
