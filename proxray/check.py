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
import stat
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("serve", "job", "monitor")
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.I)


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
    """``serve`` (a Serve config: ``applications``), ``job`` (``query_sets``) or ``monitor`` (``state_dir`` and
    ``job``), from the top-level keys."""
    if not isinstance(raw, dict):
        raise ValueError("the top level must be a mapping")
    if "applications" in raw:
        return "serve"
    if "query_sets" in raw:
        return "job"
    if "state_dir" in raw and "job" in raw:
        return "monitor"
    raise ValueError("not a Serve config (applications:), an evaluation job config (query_sets:) or a monitor config "
                     f"(state_dir: and job:); top-level keys: {', '.join(map(str, raw)) or 'none'}")


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
    demand = {"serve": _check_serve, "job": _check_job, "monitor": _check_monitor}[report.kind](raw, report, simulate)
    if address and demand is not None:
        _check_cluster(address, demand, report)
    return report


# ---- the parts every kind shares -----------------------------------------------------------------
def _validated(cls, raw, report: Report, prefix: str = ""):
    """``raw`` as the pydantic model ``cls``, or None with every field problem (after ``prefix``) added to ``report``."""
    from pydantic import ValidationError

    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        report.problems += [prefix + p for p in _validation(e)]
        return None


def _job_demand(models) -> list:
    """(model id, accelerator type, GPUs) of a job's models: every replica of every model at once."""
    return [(m.id, m.accelerator_type, m.replicas * m.replica_gpus()) for m in models]


def _validation(e) -> list:
    """One line per pydantic error: the field, the rule and the value given."""
    from proxray.common.yamlconfig import _short

    return [f"{'.'.join(map(str, x['loc'])) or '(top level)'}: {x['msg']} (got {_short(x.get('input'))})"
            for x in e.errors()]


KEY_FILE_RULE = ("readable by its owner only (600 or 400), or read-only for its owner and group with nothing for "
                 "others (440: a Kubernetes Secret mounted with the pod's fsGroup)")


def key_file_mode_ok(mode: int) -> bool:
    """The key-file rule: no permission for others; the group may read only a file no one can write."""
    return not mode & 0o007 and (not mode & 0o070 or (mode & 0o070 == 0o040 and not mode & 0o200))


def key_file_problems(path: str, what: str) -> list:
    """A key or token file: present, not empty, and its mode within ``KEY_FILE_RULE`` (on this machine)."""
    p = Path(os.path.expanduser(path))
    if not p.is_file():
        return [f"{what}: {path} does not exist on this machine (create it with mode 600; it must be on every node)"]
    mode = stat.S_IMODE(p.stat().st_mode)
    problems = []
    if not key_file_mode_ok(mode):
        problems.append(f"{what}: {path} has mode {mode:o}; a key file must be {KEY_FILE_RULE}: chmod 600 {path}")
    if not p.read_text().strip():
        problems.append(f"{what}: {path} is empty")
    return problems


def secret_problems(models, where: str) -> list:
    """A secret written into a model's runtime_env (it would be stored with the job or the app, and logged); an
    endpoint's key file that is missing, empty or readable by others."""
    out = []
    for i, m in enumerate(models):
        if getattr(m, "api_key_file", None):
            out += key_file_problems(m.api_key_file, f"{where}.{i}.api_key_file")
        env = ((m.runtime_env or {}).get("env_vars") or {}) if hasattr(m, "runtime_env") else {}
        for name, value in env.items():
            if SECRET_NAME.search(name) and value:
                out.append(f"{where}.{i}.runtime_env.env_vars.{name}: a secret in a runtime_env is stored with the "
                           "config and shown by Ray; give it to the nodes as a file (a file_mount, mode 600)")
    return out


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
    """The proxray app's ``args``: schema, router, models, key, prices. Returns its GPU demand at minimum scale."""
    from proxray.pool.preflight import check_models
    from proxray.serve.preflight import relay_problems, router_problems
    from proxray.serve.schemas import AppArgs

    a = _validated(AppArgs, args, report, f"{where}.")
    if a is None:
        return []
    report.problems += router_problems(a.router, a.encoder, [m.id for m in a.models], a.new_models, f"{where}.router")
    if not a.simulate:
        report.problems += check_models(a.models, a.default_max_tokens)[1]
    report.problems += relay_problems(a.models, f"{where}.models")
    report.problems += secret_problems(a.models, f"{where}.models")
    if a.keys_file:
        from proxray.serve.keys import read_keys

        try:
            unknown = sorted({m for k in read_keys(os.path.expanduser(a.keys_file)).keys
                              for m in k.allowed_models or () if m not in {x.id for x in a.models}})
            if unknown:
                report.problems.append(f"{where}.keys_file: allowed_models name models the app does not serve: "
                                       f"{', '.join(unknown)}")
        except (OSError, ValueError) as e:
            report.problems.append(f"{where}.keys_file: {str(e).splitlines()[0]}")
    if a.api_key_file:
        report.problems += key_file_problems(a.api_key_file, f"{where}.api_key_file")
    elif a.api_key_env:
        if not os.environ.get(a.api_key_env):
            report.notes.append(f"api_key_env {a.api_key_env}: not set here; it must be set on every node")
    elif not a.keys_file:
        report.notes.append("no api_key_file: the endpoint answers anyone who reaches it")
    if a.simulate:
        report.notes.append("simulate: every engine is the simulated one (a rehearsal), resources as configured")
    return [_served_demand(m) for m in a.models]


def _served_demand(m) -> tuple:
    """(model id, accelerator type, GPUs at minimum scale) of a served model."""
    n = m.autoscaling.initial_replicas if m.autoscaling.initial_replicas is not None else m.autoscaling.min_replicas
    return m.id, m.accelerator_type, n * m.replica_gpus()


# ---- an evaluation job config ---------------------------------------------------------------------
def _check_job(raw: dict, report: Report, simulate: bool = False):
    from proxray.evaljob import ConfigError, JobConfig, check_config
    from proxray.evaljob.config import rehearsal

    cfg = _validated(JobConfig, raw, report)
    if cfg is None:
        return None
    if simulate:
        cfg = rehearsal(cfg)
        report.notes.append("simulate: every engine is the simulated one, Hub query sets their synthetic stand-ins")
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
    from proxray.evaljob import JobConfig
    from proxray.monitor.config import MonitorConfig, rehearsal
    from proxray.pool.preflight import check_models
    from proxray.routing.artifact import ArtifactError, read_manifest

    cfg = _validated(MonitorConfig, raw, report)
    if cfg is None:
        return None
    if simulate:
        cfg = rehearsal(cfg)
        report.notes.append("simulate: the evaluations it submits run every model on the simulated engine")
    job = JobConfig.model_validate({**cfg.job, "query_sets": [{"path": "live.jsonl"}]})

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


# ---- against a cluster ---------------------------------------------------------------------------
def _check_cluster(address: str, demand: list, report: Report) -> None:
    """The accelerator types and GPUs ``demand`` asks for ((id, type, GPUs) each) against the cluster at ``address``:
    its live nodes and the node types its autoscaler can start."""
    import ray

    from proxray.evaljob.preflight import autoscaler_accelerators

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, log_to_driver=False)
    try:
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        scalable = autoscaler_accelerators()
    finally:
        if started:
            ray.shutdown()
    live = {}  # GPUs of the live nodes, by their accelerator type (None: every GPU)
    for res in nodes:
        for k in res:
            if k.startswith("accelerator_type:"):
                live[k.split(":", 1)[1]] = live.get(k.split(":", 1)[1], 0.0) + res.get("GPU", 0.0)
        live[None] = live.get(None, 0.0) + res.get("GPU", 0.0)
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
