"""Checks before the job starts: the config (model sources, engines and their kwargs, accelerator names, the V100
refusal, query files, the output location) before Ray starts, and the cluster's accelerators once connected."""
from __future__ import annotations

import os
from pathlib import Path

from proxray.evaljob.config import ConfigError, JobConfig


VOLTA = {"V100"}  # Ray's accelerator names of sm_70 GPUs


def volta_refusal(model_id: str, where: str) -> str:
    """Why a vllm model cannot run on V100 nodes, and the path that does."""
    return (f"model {model_id!r}: engine vllm cannot run on {where}: vLLM 0.29's CUDA 13 wheels (what "
            "ray[llm]==2.60.0 pins) carry no sm_70 (Volta) kernels. On V100 nodes run it with engine: transformers "
            "at dtype float16 in a runtime_env holding a torch built for sm_70, as jobs/configs/paper_pool_v100.yaml "
            "does; or give it accelerator_type A100 or H100")


def known_accelerators() -> set:
    """Ray's accelerator type names (``ray.util.accelerators``)."""
    from ray.util.accelerators import accelerators

    return {v for k, v in vars(accelerators).items() if k.isupper() and isinstance(v, str)}


def check_config(config: JobConfig, output=None) -> dict:
    """Everything that would otherwise fail inside a Ray actor or half-way through the job, checked
    before Ray starts; every problem is reported at once (``ConfigError``): model sources, engines and
    their kwargs, accelerator names, local query files, the output location. Returns ``{model id:
    source}`` with local folders resolved to absolute paths (Ray workers may run in another directory)."""
    from proxray.pool.preflight import check_models

    sources, problems = check_models(config.models, config.sampling.max_tokens)
    known = known_accelerators() if any(m.accelerator_type for m in config.models) else set()
    problems += [volta_refusal(m.id, f"{m.accelerator_type} nodes") for m in config.models
                 if m.engine == "vllm" and m.accelerator_type in VOLTA]
    for m in config.models:
        if m.accelerator_type and m.accelerator_type not in known:
            import difflib

            hint = difflib.get_close_matches(m.accelerator_type, known, n=1)
            problems.append(f"model {m.id!r}: accelerator_type {m.accelerator_type!r} is not one of Ray's accelerator "
                            f"types" + (f"; did you mean {hint[0]!r}?" if hint else f" ({', '.join(sorted(known))})"))
    from proxray.common.storage import check_location, is_uri

    for i, qs in enumerate(config.query_sets):
        if qs.path is not None and is_uri(qs.path):
            try:
                check_location(qs.path, f"query_sets.{i}.path", file=True)
            except (ValueError, FileNotFoundError) as e:
                problems.append(str(e))
        elif qs.path is not None and not Path(qs.path).is_file():
            problems.append(f"query_sets.{i}.path: {qs.path!r} does not exist (relative paths are taken from "
                            f"{os.getcwd()})")
    try:
        check_location(output or config.output, "output", write=True)
    except ValueError as e:
        problems.append(str(e))
    if problems:
        raise ConfigError("invalid job config:\n" + "\n".join(f"  {p}" for p in problems))
    return sources


def cluster_resources() -> tuple[dict, set]:
    """What the connected Ray cluster has and can start: (the GPUs of its live nodes by accelerator type, None for
    every GPU; the accelerator types of the node types its autoscaler can start, ``autoscaler_accelerators``). The
    job's check (``check_cluster``) and ``proxray check --address`` both read it."""
    import ray

    live = {}
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        for k in res:
            if k.startswith("accelerator_type:"):
                live[k.split(":", 1)[1]] = live.get(k.split(":", 1)[1], 0.0) + res.get("GPU", 0.0)
        live[None] = live.get(None, 0.0) + res.get("GPU", 0.0)
    return live, autoscaler_accelerators()


def cluster_accelerators() -> set:
    """Accelerator types this Ray cluster has or can start: those of its live nodes, and those of the
    node types in the autoscaler's config (``autoscaler_accelerators``)."""
    live, scalable = cluster_resources()
    return (set(live) - {None}) | scalable


def autoscaler_accelerators() -> set:
    """Accelerator types of the node types the autoscaler can start: from its config (``~/ray_bootstrap_config.yaml``
    on a ``ray up`` head, where a submitted job's driver runs; ``PROXRAY_AUTOSCALER_CONFIG`` names another)."""
    types = set()
    bootstrap = Path(os.environ.get("PROXRAY_AUTOSCALER_CONFIG", "~/ray_bootstrap_config.yaml")).expanduser()
    if bootstrap.is_file():
        import yaml

        try:
            node_types = (yaml.safe_load(bootstrap.read_text()) or {}).get("available_node_types") or {}
        except yaml.YAMLError:
            node_types = {}
        types |= {k.split(":", 1)[1] for t in node_types.values() for k in (t.get("resources") or {})
                  if k.startswith("accelerator_type:")}
    return types


def check_cluster(specs) -> None:
    """After connecting to Ray, before any work: every model's accelerator type is among the cluster's, and a vllm
    model that names none has a GPU it can run on (not only V100s)."""
    wanted = {m.id: m.accelerator_type for m in specs if m.accelerator_type}
    unplaced_vllm = [m.id for m in specs if m.engine == "vllm" and not m.accelerator_type and m.gpus]
    if not wanted and not unplaced_vllm:
        return
    have = cluster_accelerators()
    if unplaced_vllm and have and have <= VOLTA:
        raise ConfigError("the cluster cannot place these models:\n" + "\n".join(
            f"  {volta_refusal(i, 'this cluster, whose GPUs are all V100')}" for i in unplaced_vllm))
    missing = [f"  model {i!r}: accelerator_type {t!r} is not among the cluster's ({', '.join(sorted(have)) or 'none'})"
               for i, t in wanted.items() if t not in have]
    if missing:
        raise ConfigError("the cluster cannot place these models:\n" + "\n".join(missing))
