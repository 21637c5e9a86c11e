"""``proxray check --config FILE``: everything that would stop a Serve config, an evaluation job config or a monitor
config, found before anything starts and reported at once.

    the schema                  every field, its value and the rule (Ray Serve's own schema for a Serve config)
    the router                  reachable, a versioned proxray artifact, fitted with the encoder the app will use,
                                knowing every served model (or the model declared in ``new_models``)
    models and inputs           model sources, engine arguments, vLLM install problems, query files, the output
    secrets                     key files present, not empty, owner-only (or 440, a Kubernetes Secret); no secret in a runtime_env
    prices                      where a budget (basis: realised) or the job needs them
    the cluster (``--address``) the accelerator types and GPUs the config asks for against the cluster's nodes and the
                                node types its autoscaler can start

``proxray serve`` and the Serve app's builder run the same checks, so a mismatch never first shows inside a replica.
A check reads files on the machine it runs on: run it where the config runs (on the head: ``ray job submit --
proxray check --config ...``) to check paths of the nodes.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from proxray.common.gcs_storage import env_file_values
from proxray.common.secrets import secret_problems

KINDS = ("serve", "job", "monitor")


@dataclass
class Report:
    """What ``check`` found: the config's kind, every problem (deploying would fail), and notes (it would deploy)."""
    path: str
    kind: str = ""
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self) -> str:
        head = f"{self.path}: {self.kind or 'config'}: "
        if self.ok:
            lines = [head + "ok, it would deploy"]
        else:
            lines = [head + f"{len(self.problems)} problem{'s' * (len(self.problems) != 1)}, it would not deploy"]
            lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def detect_kind(raw) -> str:
    """``serve`` (a Serve config: ``applications``), ``job`` (``query_sets``), ``monitor`` (``state_dir`` and
    ``job``) or ``cluster`` (a Ray cluster launcher config: ``provider`` and ``available_node_types``), from the
    top-level keys."""
    if not isinstance(raw, dict):
        raise ValueError("the top level must be a mapping")
    if "applications" in raw:
        return "serve"
    if "query_sets" in raw:
        return "job"
    if "state_dir" in raw and "job" in raw:
        return "monitor"
    if "available_node_types" in raw and "provider" in raw:
        return "cluster"
    raise ValueError("not a Serve config (applications:), an evaluation job config (query_sets:), a monitor config "
                     "(state_dir: and job:) or a Ray cluster launcher config (provider: and available_node_types:); "
                     f"top-level keys: {', '.join(map(str, raw)) or 'none'}")


def simulated_serve_config(raw: dict) -> dict:
    """A Serve config as its rehearsal: ``simulate: true`` in every proxray application's args."""
    apps = [{**app, "args": {**(app.get("args") or {}), "simulate": True}}
            if app.get("import_path") == "proxray.serve.app:build_app" else app for app in raw.get("applications", [])]
    return {**raw, "applications": apps}


def check(path, address: str | None = None, simulate: bool = False) -> Report:
    """Check the config at ``path``; ``address``: a Ray cluster to check its resources against; ``simulate``: check
    its rehearsal (every engine the simulated one, Hugging Face query sets their synthetic stand-ins)."""
    import yaml

    report = Report(str(path))
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        report.problems.append(f"cannot read it ({e.strerror})")
        return report
    except yaml.YAMLError as e:
        report.problems.append(f"not valid YAML: {e}")
        return report
    try:
        report.kind = detect_kind(raw)
    except ValueError as e:
        report.problems.append(str(e))
        return report
    if simulate and report.kind == "serve":
        raw = simulated_serve_config(raw)
    demand = {"serve": _check_serve, "job": _check_job, "monitor": _check_monitor,
              "cluster": _check_cluster_config}[report.kind](raw, report, simulate)
    if address and demand is not None:
        _check_cluster(address, demand, report)
    return report


# ---- the parts every kind shares -----------------------------------------------------------------
def _validated(cls, raw, report: Report, prefix: str = "", rehearse=None, note: str = ""):
    """``raw`` as the pydantic model ``cls``, or None with every field problem (after ``prefix``) added to ``report``;
    ``rehearse``: a function turning it into its rehearsal (``--simulate``), said in a ``note``."""
    from pydantic import ValidationError

    try:
        cfg = cls.model_validate(raw)
    except ValidationError as e:
        report.problems += [prefix + p for p in _validation(e)]
        return None
    if rehearse:
        cfg = rehearse(cfg)
        if note:
            report.notes.append(note)
    return cfg


def _job_demand(models) -> list:
    """(model id, accelerator type, GPUs) of a job's models: every replica of every model at once."""
    return [(m.id, m.accelerator_type, m.replicas * m.replica_gpus()) for m in models]


def _validation(e) -> list:
    from proxray.common.yamlconfig import error_lines

    return error_lines(e)


# ---- a Serve config ------------------------------------------------------------------------------
def _check_serve(raw: dict, report: Report, simulate: bool = False):
    from ray.serve.schema import ServeDeploySchema

    if _validated(ServeDeploySchema, raw, report, "serve schema: ") is None:
        return None
    demand = []
    for i, app in enumerate(raw["applications"]):
        if app.get("import_path") == MONITOR_APP:
            _check_monitor_app(app.get("args") or {}, report, f"applications.{i}.args", simulate)
            continue
        if app.get("import_path") != "proxray.serve.app:build_app":
            report.notes.append(f"applications.{i}: {app.get('import_path')!r} is not proxray's app; not checked")
            continue
        demand += check_app_args(app.get("args") or {}, report, f"applications.{i}.args")
    return demand


MONITOR_APP = "proxray.monitor.app:build_app"


def _check_monitor_app(args: dict, report: Report, where: str, simulate: bool) -> None:
    """The monitor as a Serve application: its args, and the monitor config it names, checked as a monitor config."""
    import yaml

    from proxray.monitor.app import MonitorAppArgs

    a = _validated(MonitorAppArgs, args, report, f"{where}.")
    if a is None:
        return
    try:
        raw = yaml.safe_load(Path(a.config).read_text())
    except (OSError, yaml.YAMLError) as e:
        report.problems.append(f"{where}.config: cannot read the monitor config {a.config} "
                               f"({getattr(e, 'strerror', None) or e})")
        return
    inner = Report(a.config)
    _check_monitor(raw, inner, simulate)
    report.problems += [f"{where}.config ({a.config}): {p}" for p in inner.problems]
    report.notes += [f"{where}.config: {n}" for n in inner.notes]


def check_app_args(args: dict, report: Report, where: str = "args") -> list:
    """The proxray app's ``args``: the schema, then what the app's builder checks (``serve.builder.app_problems``: the
    router, models, relayed fields, secrets, keys and key file). Returns its GPU demand at minimum scale."""
    from proxray.serve.builder import app_problems, rehearsed
    from proxray.serve.config import AppArgs

    a = _validated(AppArgs, args, report, f"{where}.", rehearse=rehearsed,
                   note="simulate: every engine is the simulated one (a rehearsal), resources as configured"
                   if args.get("simulate") else "")
    if a is None:
        return []
    report.problems += app_problems(a, f"{where}.")[1]
    if a.api_key_env and not a.api_key_file and not os.environ.get(a.api_key_env):
        report.notes.append(f"api_key_env {a.api_key_env}: not set here; it must be set on every node")
    elif not (a.api_key_file or a.api_key_env or a.keys_file):
        report.notes.append("no api_key_file: the endpoint answers anyone who reaches it")
    return [_served_demand(m) for m in a.models]


def _served_demand(m) -> tuple:
    """(model id, accelerator type, GPUs at minimum scale) of a served model."""
    n = m.autoscaling.initial_replicas if m.autoscaling.initial_replicas is not None else m.autoscaling.min_replicas
    return m.id, m.accelerator_type, n * m.replica_gpus()


# ---- an evaluation job config ---------------------------------------------------------------------
def _check_job(raw: dict, report: Report, simulate: bool = False):
    from proxray.evaljob import ConfigError, JobConfig, check_config
    from proxray.evaljob.config import rehearsal

    cfg = _validated(JobConfig, raw, report, rehearse=simulate and rehearsal, note="simulate: every engine is the "
                     "simulated one, Hub query sets their synthetic stand-ins")
    if cfg is None:
        return None
    hub = [i for i, qs in enumerate(cfg.query_sets) if qs.hf is not None]
    try:
        check_config(cfg)
    except ConfigError as e:
        report.problems += [line.strip() for line in str(e).splitlines()[1:]]
    report.problems += secret_problems(cfg.models, "models")
    if hub:
        report.notes.append(f"query_sets {hub} come from the Hugging Face Hub: the cluster needs Hub access (and "
                            "`datasets`); gated weights need the token file on every node")
    return _job_demand(cfg.models)


# ---- a monitor config ----------------------------------------------------------------------------
def _check_monitor(raw: dict, report: Report, simulate: bool = False):
    from proxray.common.storage import check_location
    from proxray.monitor.config import MonitorConfig, rehearsal
    from proxray.pool.preflight import check_models
    from proxray.routing.artifact import ArtifactError, read_manifest

    cfg = _validated(MonitorConfig, raw, report, rehearse=simulate and rehearsal,
                     note="simulate: the evaluations it submits run every model on the simulated engine")
    if cfg is None:
        return None
    job = cfg.job

    try:
        manifest = read_manifest(cfg.router)
        known = [m.id for m in job.models]
        missing = [m for m in manifest.models if m not in known]
        if missing:
            report.problems.append(f"job.models: the router's models {missing} are not in the job template: the "
                                   "monitor could not label traffic for them")
    except (ArtifactError, OSError, ValueError) as e:
        report.problems.append(f"router: {e}")
    if cfg.table != "embedded":
        try:
            check_location(cfg.table, "table", file=True)
        except (ValueError, FileNotFoundError) as e:
            report.problems.append(str(e))
    try:
        check_location(cfg.state_dir, "state_dir", write=True)
    except ValueError as e:
        report.problems.append(str(e))
    report.problems += [f"job: {p}" for p in check_models(job.models, job.sampling.max_tokens)[1]]
    report.problems += secret_problems(job.models, "job.models")
    return _job_demand(job.models)


# how a Ray 2.60 cluster's head is told of an external Redis for its GCS (Ray's GCS fault tolerance), in its commands:
# RAY_REDIS_ADDRESS in ray start's environment (ray/_private/node.py); `ray start` has no flag for it
GCS_FT_MARKS = re.compile(r"RAY_REDIS_ADDRESS=[^\s;]")
HEAD_LOSS = ("a head loss takes the whole cluster: without the GCS the workers' raylets exit within a minute "
             "(gcs_rpc_server_reconnect_timeout_s), every replica with them, the endpoint is down until the cluster "
             "is started again, and what the app's shared actors hold in memory (the keys' spend in their windows, "
             "conversations, the answer book, stored responses) starts empty: their checkpoints live in the GCS's "
             "key-value store, which without Redis dies with the head")


def gcs_redis_source(raw: dict) -> str | None:
    """Where a launcher config's head learns of an external Redis for its GCS — its own commands, or the
    ``~/.proxray/env`` they load, read from the local folder ``file_mounts`` copies to the nodes — or None."""
    said = " ".join(str(c) for key in ("head_start_ray_commands", "head_setup_commands", "setup_commands",
                                       "initialization_commands") for c in raw.get(key) or [])
    said += " " + str((raw.get("docker") or {}).get("run_options") or "")
    if GCS_FT_MARKS.search(said):
        return "the head's start commands"
    if "~/.proxray/env" in said:
        for remote, local in (raw.get("file_mounts") or {}).items():
            if str(remote).rstrip("/").endswith("/.proxray"):
                env = Path(os.path.expanduser(str(local))) / "env"
                if env_file_values(env).get("RAY_REDIS_ADDRESS"):
                    return f"RAY_REDIS_ADDRESS in {local.rstrip('/')}/env"
    return None


def _ray_version() -> str:
    import ray

    return ray.__version__


def ray_start_flags() -> set:
    """Every option the installed Ray's ``ray start`` takes (its click command's own list)."""
    from ray.scripts.scripts import start

    return {o for p in start.params for o in (*p.opts, *p.secondary_opts)}


def unknown_ray_start_flags(commands) -> list:
    """The ``--flags`` given to ``ray start`` in ``commands`` (shell command strings) that it does not take."""
    known, out = ray_start_flags(), []
    for command in commands:
        for part in re.split(r";|&&|\|\|", str(command)):
            m = re.search(r"\bray start\b(.*)", part)
            if not m:
                continue
            try:
                words = shlex.split(m.group(1))
            except ValueError:  # an unbalanced quote: the words as they stand
                words = m.group(1).split()
            out += [w.split("=", 1)[0] for w in words if w.startswith("--") and w.split("=", 1)[0] not in known]
    return list(dict.fromkeys(out))


def _check_cluster_config(raw: dict, report: Report, simulate: bool = False):
    """A Ray cluster launcher config (``cluster.yaml``): its head's start commands, and the ``~/.proxray/env`` they
    load, read for GCS fault tolerance (an external Redis); without it, a warning saying what a head loss costs."""
    head_type = raw.get("head_node_type")
    types = raw.get("available_node_types") or {}
    if not isinstance(types, dict) or head_type not in types:
        report.problems.append(f"head_node_type: {head_type!r} is not one of available_node_types "
                               f"({', '.join(map(str, types)) if isinstance(types, dict) else 'not a mapping'})")
        return None
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        for flag in unknown_ray_start_flags(raw.get(key) or []):
            report.problems.append(f"{key}: ray start has no option {flag} (Ray {_ray_version()}: "
                                   "`ray start --help` lists them)")
    source = gcs_redis_source(raw)
    if source is None:
        report.notes.append("warning: no GCS fault tolerance (no external Redis: RAY_REDIS_ADDRESS in the head's "
                            f"ray start environment, e.g. in ~/.proxray/env); {HEAD_LOSS}")
    else:
        report.notes.append(f"GCS fault tolerance: an external Redis ({source})")
    return None


# ---- against a cluster ---------------------------------------------------------------------------
def _check_cluster(address: str, demand: list, report: Report) -> None:
    """The accelerator types and GPUs ``demand`` asks for ((id, type, GPUs) each) against the cluster at ``address``:
    its live nodes and the node types its autoscaler can start."""
    import ray

    from proxray.evaljob.preflight import cluster_resources

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, log_to_driver=False)
    try:
        live, scalable = cluster_resources()  # GPUs of the live nodes by accelerator type (None: every GPU)
    finally:
        if started:
            ray.shutdown()
    wanted = {}
    for model, acc, gpus in demand:
        if acc and acc not in live and acc not in scalable:
            report.problems.append(f"model {model!r}: accelerator_type {acc} is on no node of the cluster and no node "
                                   f"type of its autoscaler has it (it has: {', '.join(sorted(set(live) - {None} | scalable)) or 'none'}); "
                                   "its replicas would stay pending (troubleshooting: pending GPU placement)")
            continue
        wanted[acc] = wanted.get(acc, 0.0) + gpus
    for acc, gpus in sorted(wanted.items(), key=lambda kv: str(kv[0])):
        cap = live.get(acc, 0.0)
        if gpus <= cap + 1e-9:
            continue
        says = f"{gpus:g} GPUs{' on ' + acc + ' nodes' if acc else ''} at minimum scale, the live nodes have {cap:g}"
        if acc in scalable or (acc is None and scalable):
            report.notes.append(f"{says}: the autoscaler must start the rest")
        else:
            report.problems.append(f"{says} and the autoscaler can start none: replicas would stay pending "
                                   "(troubleshooting: pending GPU placement)")
    asked = [f"{gpus:g} GPUs on {acc or 'any'} nodes" for acc, gpus in sorted(wanted.items(), key=lambda kv: str(kv[0]))
             if gpus]
    report.notes.append(f"cluster {address}: " + (", ".join(asked) if asked else "no GPUs asked for") + " at minimum scale")
