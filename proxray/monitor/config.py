"""The monitor's configuration (``monitor.yaml``), validated before anything starts."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from proxray.common.yamlconfig import StrictModel
from proxray.evaljob.config import JobTemplate


class GateSpec(StrictModel):
    """``gate:`` of the monitor config: what a router version must show before it serves (proxray.monitor.gate,
    .sources, .candidates). The defaults are measured in the drift-monitor guide ("The gate")."""
    enabled: bool = Field(True, description="false: every version the monitor grows serves at once (no gate, no "
                          "shadow window, no spot checks)")
    folds: int = Field(5, ge=2, description="folds of the new labels: each scored by a router that never saw it")
    train_sample: int = Field(1000, ge=0, description="training queries scored, each left out (a seeded sample)")
    train_tolerance: float = Field(0.02, ge=0, description="utility (acc − λ·cost) the candidate may lose on the "
                                   "training queries beyond noise (Δ + 1.645·SE)")
    new_tolerance: float = Field(0.02, ge=0, description="utility the candidate may lose on the new labels, held "
                                 "out, beyond noise (Δ + 1.645·SE)")
    window_requests: int = Field(50, ge=0, description="routed requests the candidate is shadowed on (0 with "
                                 "window_s 0: no window)")
    window_s: float = Field(600.0, ge=0, description="the shadow window ends after this long even with fewer requests")
    min_inlier_agreement: float = Field(0.8, ge=0, le=1, description="share of the served router's inliers on which "
                                        "the candidate must choose the same model in its window")
    spot_checks: int = Field(4, ge=1, description="queries of each feedback batch the judge grades before it trains")
    canary_cells: int = Field(30, ge=1, description="(training query, model) labels the judge grades again in each "
                              "evaluation it labels: its spot check (whole queries, every model, until this many)")
    trust_floor: float = Field(0.75, ge=0, le=1, description="agreement with the spot checks under which a label "
                               "source is set aside")
    rollback_min_feedback: int = Field(20, ge=1, description="feedback scores a promoted version and its predecessor "
                                       "need before live feedback can roll it back")
    rollback_margin: float = Field(0.15, ge=0, le=1, description="mean feedback score a promoted version may lose "
                                   "against its predecessor's before it is rolled back by itself")


class MonitorConfig(StrictModel):
    """What ``proxray monitor start --config monitor.yaml`` reads. Paths are made absolute (the actor and
    the evaluation jobs run in other directories); ``state_dir`` must be storage every node reads."""
    name: str = Field("proxray-monitor", min_length=1, description="the detached actor's name (namespace proxray); "
                      "the Serve app's `monitor:` names it")
    router: str = Field(description="the served router's artifact (version 0)")
    table: str = Field(description="the routing table it was fitted on, in the order it was fitted (what "
                       "`proxray fit --table` does); `embedded`: the embedded synthetic table (`proxray fit` without --table)")
    state_dir: str = Field(description="checkpoints, evaluation inputs and outputs, new router versions")
    job: JobTemplate = Field(description="the evaluation job it runs on the queries it picks: an evaluation job "
                             "config without query_sets and output; its grader (a judge of the pool) labels live "
                             "traffic, which has no reference answers")
    z: int = Field(3, ge=1, description="top-z models compared by J_z")
    lam: float = Field(0.0, ge=0, description="λ of the objective acc − λ·cost ranked by J_z")
    window: int = Field(500, ge=10, description="recent routed queries kept (grouping, J_z re-evaluation)")
    n_groups: int = Field(8, ge=1, description="traffic groups: clusters of the training embeddings (× inlier/outlier)")
    quantile: float | None = Field(None, gt=0, lt=1, description="deprecated, ignored: the outlier threshold is the "
                                   "router's own, saved in its artifact (what `proxray explain` shows)")
    overlap_threshold: float | Literal["auto"] = Field(
        "auto", description="J_z below which a traffic group is re-evaluated; auto: half the mean J_z of the "
        "training tasks against each other")
    min_group: int = Field(10, ge=1, description="shadow-labelled queries a group needs before its J_z counts")
    shadow_rate: float = Field(0.1, ge=0, le=1, description="fraction of routed traffic evaluated on the whole pool")
    shadow_batch: int = Field(20, ge=1, description="shadow queries per shadow evaluation job")
    shadow_max_wait_s: float = Field(300.0, ge=0, description="a smaller shadow batch goes out once its oldest query waited this long")
    min_batch: int = Field(20, ge=1, description="drifted queries per re-evaluation job")
    feedback_batch: int = Field(8, ge=1, description="users' scored queries added to the router at a time, on "
                                "their own (scores of queries an evaluation labels join its labels instead)")
    feedback_max_wait_s: float = Field(300.0, ge=0, description="a smaller feedback batch goes once its oldest score "
                                       "waited this long (also a score whose query waits for an evaluation)")
    max_buffer: int = Field(2000, ge=1, description="cap of the drift and shadow queues (further queries are dropped, counted)")
    max_evals_per_hour: int = Field(4, ge=0, description="re-evaluation jobs started per hour at most")
    cost_budget: float = Field(1.0, ge=0, description="USD for all evaluations: generation on the pool + the judge")
    est_cost_per_query: float | None = Field(None, gt=0, description="USD to evaluate one query on the whole pool "
                                             "with the judge; default from the training table, then learned")
    tick_s: float = Field(5.0, gt=0, description="the scheduler's period")
    job_timeout_s: float = Field(3600.0, gt=0, description="a job running longer is stopped, marked failed, retried")
    retry_after_s: float = Field(300.0, ge=0, description="wait before retrying a failed evaluation's queries")
    jobs_address: str | None = Field(None, description="Ray Jobs API (dashboard) URL; default: the cluster's own")
    gate: GateSpec = Field(default_factory=GateSpec, description="the gate before a version serves: held-out "
                           "scores, a shadow window, label sources' spot checks, rollback on live feedback")
    submit: Literal["jobs_api", "inline"] = Field("jobs_api", description="inline: run jobs in the actor (tests)")

    @field_validator("quantile")
    @classmethod
    def _deprecated_quantile(cls, v):
        if v is not None:
            import warnings

            warnings.warn("monitor config: quantile is deprecated and ignored: the outlier threshold is the router's "
                          "own (its artifact's, what `proxray explain` shows)", DeprecationWarning, stacklevel=2)
        return v

    @field_validator("router", "table", "state_dir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        return v if "://" in v or v == "embedded" else str(Path(v).expanduser().resolve())

    @field_validator("job", mode="before")
    @classmethod
    def _no_queries(cls, job):
        if isinstance(job, dict) and ("query_sets" in job or "output" in job):
            raise ValueError("leave out query_sets and output (the monitor writes them per evaluation)")
        return job

    @field_validator("job")
    @classmethod
    def _judged(cls, job: JobTemplate) -> JobTemplate:
        if job.grader is None:
            raise ValueError("grader: required (live traffic has no reference answers; name a judge model of the pool)")
        return job


def load_monitor_config(path) -> MonitorConfig:
    """Read and validate ``monitor.yaml``; errors name the file, the field, the value and the rule."""
    return MonitorConfig.from_file(path, "monitor config")


def rehearsal(config: MonitorConfig) -> MonitorConfig:
    """The config as a rehearsal (``proxray monitor start --simulate``): the evaluations it submits run every model of
    its job template on the simulated engine, with its price and resources (``proxray.pool.simulated.rehearsal``)."""
    from proxray.pool.simulated import rehearsal as simulated

    job = config.job.model_copy(update={"models": [simulated(m) for m in config.job.models]})
    return config.model_copy(update={"job": job})

