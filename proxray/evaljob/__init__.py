"""The evaluation job: a YAML config, the pool fanned out over Ray Data, grading, pricing, and per-query tables
written to any filesystem URI. ``proxray build-table`` and ``ray job submit`` run it."""
from proxray.evaljob.job import (ConfigError, JobConfig, ModelSpec, check_config, load_config, read_parts,
                                 run_job)

__all__ = ["ConfigError", "JobConfig", "ModelSpec", "check_config", "load_config", "read_parts", "run_job"]
