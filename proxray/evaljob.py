"""The evaluation job: run every model of the pool on every query with Ray Data, grade, price, and
write the routing table.

    proxray build-table --config CONFIG.yaml [--output DIR] [--models a,b]
    ray job submit --working-dir . -- python jobs/build_table.py --config CONFIG.yaml

Output folder::

    table/<model>/part-*.parquet   the routing table, partitioned by model, one file per finished batch
    routing_table.parquet          the same, consolidated: queries that have every model
    summary.md, summary.csv        model × task accuracy (%) and cost, like the paper's Table 2
    errors/<model>/*.parquet       rows an engine failed on (never graded); retried by the next run
    errors.parquet                 the failures not yet resolved by a later run

Resumable and lossless: each batch is written (atomically) as soon as it comes back, and a run does
only the (query, model) pairs missing from ``table/``. So an interrupted job loses at most the batches
in flight, a re-run finishes it, and adding a model to the config runs only that model.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .engines import Sampling
from .grading import grade
from .logs import log


# ---- configuration (validated at the boundary) --------------------------------------------------
class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, description="model name in the table")
    source: str | None = Field(None, description="weights: Hub id or local folder (default: id)")
    price_in: float = Field(ge=0, description="USD per million input tokens")
    price_out: float = Field(ge=0, description="USD per million output tokens")
    engine: Literal["vllm", "transformers", "sim"]
    engine_kwargs: dict = Field(default_factory=dict)
    accelerator_type: str | None = Field(None, description="e.g. H100, A100 (vllm)")
    gpus_per_replica: int = Field(1, ge=0, description="vllm: GPUs per engine (tensor parallel when > 1)")
    placement_group_config: dict | None = Field(
        None, description="vllm: Ray placement bundles per engine, e.g. {bundles: [{CPU: 1}]} on a CPU cluster")
    runtime_env: dict | None = Field(None, description="vllm: Ray runtime_env of the engine workers (env_vars, ...)")
    replicas: int = Field(1, ge=1)
    batch_size: int = Field(16, ge=1)
    num_cpus: float = Field(1.0, gt=0, description="CPUs per replica (sim, transformers); vllm: CPUs per actor "
                            "of the processor's chat-template, tokenize and detokenize stages")


class SyntheticSet(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n_per_task: int = Field(20, ge=1)
    seed: int = 0


class QuerySetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, description="written to the table's split column")
    path: str | None = None
    hf: str | None = Field(None, description="one of the paper's ten tasks, from the Hugging Face Hub")
    split: str | None = None
    n: int | None = Field(None, ge=1)
    synthetic: SyntheticSet | None = None

    @model_validator(mode="after")
    def _one_source(self):
        given = [k for k in ("path", "hf", "synthetic") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a query set needs exactly one of path, hf, synthetic (got: {', '.join(given) or 'none'})")
        return self


class SamplingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(0.0, ge=0)
    max_tokens: int = Field(64, ge=1)
    seed: int = 42


class JobConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    output: str = "out/table"
    models: list[ModelSpec] = Field(min_length=1)
    query_sets: list[QuerySetSpec] = Field(min_length=1)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)

    @model_validator(mode="after")
    def _unique_models(self):
        ids = [m.id for m in self.models]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"model ids must be unique; repeated: {', '.join(dup)}")
        return self


class ConfigError(ValueError):
    pass


def check_config(config: JobConfig) -> dict:
    """Everything about the models that would otherwise fail inside a Ray actor, checked before Ray
    starts; every problem is reported at once (``ConfigError``). Returns ``{model id: source}`` with
    local folders resolved to absolute paths (Ray workers may run in another directory)."""
    from .engines import check_models

    sources, problems = check_models(config.models, config.sampling.max_tokens)
    if problems:
        raise ConfigError("invalid job config:\n" + "\n".join(f"  {p}" for p in problems))
    return sources


def load_config(path) -> JobConfig:
    """Read and validate a job YAML; errors name the file, the field, the value and the rule."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    try:
        return JobConfig.model_validate(raw)
    except ValidationError as e:
        lines = [f"  {'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']} (got {err.get('input')!r})"
                 for err in e.errors()]
        raise ConfigError(f"{path}: invalid job config:\n" + "\n".join(lines)) from None


# ---- queries -------------------------------------------------------------------------------------
def load_queries(config: JobConfig, load_dataset=None) -> pd.DataFrame:
    from .querysets import hf_queries, read_queries, synthetic_queries, validate_queries

    frames = []
    for i, qs in enumerate(config.query_sets):
        if qs.path is not None:
            df = read_queries(qs.path)
        elif qs.hf is not None:
            df = hf_queries(qs.hf, qs.split, qs.n, seed=config.sampling.seed, load_dataset=load_dataset)
        else:
            df = synthetic_queries(qs.synthetic.n_per_task, qs.synthetic.seed)
        df["split"] = qs.name or qs.hf or (Path(qs.path).stem if qs.path else "synthetic")
        frames.append(df)
    return validate_queries(pd.concat(frames, ignore_index=True), "query sets")


# ---- output layout -------------------------------------------------------------------------------
def slug(model_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", model_id.replace("/", "__"))


def _write_atomic(df: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)  # a reader never sees half a file; a crash leaves only a .tmp


def read_parts(folder: Path) -> pd.DataFrame:
    files = sorted(folder.rglob("*.parquet")) if folder.is_dir() else []
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()


def done_ids(out: Path, model_id: str) -> set:
    parts = read_parts(out / "table" / slug(model_id))
    return set(parts["query_id"]) if len(parts) else set()


# ---- running one model ---------------------------------------------------------------------------
class EngineWorker:
    """Ray Data actor: one engine per replica; a batch in, one output row per input row out.
    A batch that fails is retried row by row, so one bad row costs only itself (``error`` column)."""

    def __init__(self, spec: dict, sampling: dict):
        from .engines import make_engine

        self.engine = make_engine(ModelSpec(**spec))
        self.sampling = Sampling(**sampling)

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        rows = batch.to_dict("records")
        try:
            outs = self.engine.generate(rows, self.sampling)
            errors = [""] * len(rows)
        except Exception:  # noqa: BLE001 - isolate the failing rows
            outs, errors = [], []
            for r in rows:
                try:
                    outs.append(self.engine.generate([r], self.sampling)[0])
                    errors.append("")
                except Exception as e:  # noqa: BLE001
                    outs.append({"response": "", "input_tokens": 0, "output_tokens": 0})
                    errors.append(f"{type(e).__name__}: {e}")
        return pd.DataFrame({"query_id": batch["query_id"].to_numpy(),
                             "response": [o["response"] for o in outs],
                             "input_tokens": [int(o["input_tokens"]) for o in outs],
                             "output_tokens": [int(o["output_tokens"]) for o in outs],
                             "error": errors})


def _dataset(spec: ModelSpec, todo: pd.DataFrame, sampling: Sampling, source: str | None = None):
    import ray

    cols = [c for c in ("query_id", "task", "prompt", "answer", "answer_type", "difficulty") if c in todo]
    items = todo[cols].to_dict("records")
    ds = ray.data.from_items(items, override_num_blocks=max(1, min(len(items) // spec.batch_size, 64)))
    if spec.engine == "vllm":
        from .engines import vllm_output_row, vllm_processor

        # failed rows skip the processor's postprocess: map every row to the output columns after it
        return vllm_processor(spec, sampling, source)(ds).map(vllm_output_row, num_cpus=spec.num_cpus)
    if source:
        spec = spec.model_copy(update={"source": source})
    return ds.map_batches(
        EngineWorker, fn_constructor_kwargs={"spec": spec.model_dump(), "sampling": vars(sampling)},
        batch_size=spec.batch_size, batch_format="pandas", compute=ray.data.ActorPoolStrategy(size=spec.replicas),
        num_cpus=spec.num_cpus)  # Ray Data restarts a dead actor and retries its batch (max_restarts=-1 by default)


def graded_rows(spec: ModelSpec, out: pd.DataFrame, todo: pd.DataFrame) -> pd.DataFrame:
    """Engine output joined with its queries: graded, priced, in the canonical table columns."""
    q = todo.set_index("query_id").loc[out["query_id"]]
    correct = [grade(r, a, t) for r, a, t in zip(out["response"], q["answer"], q["answer_type"])]
    n_in = out["input_tokens"].to_numpy(dtype=np.int64)
    n_out = out["output_tokens"].to_numpy(dtype=np.int64)
    return pd.DataFrame({
        "query_id": out["query_id"].to_numpy(), "task": q["task"].to_numpy(), "prompt": q["prompt"].to_numpy(),
        "model": spec.id, "correct": np.asarray(correct, dtype=np.float64),
        "cost": (n_in * spec.price_in + n_out * spec.price_out) / 1e6,  # USD from the engine's own token counts
        "split": q["split"].to_numpy(), "response": out["response"].astype(str).to_numpy(),
        "input_tokens": n_in, "output_tokens": n_out})


def run_model(spec: ModelSpec, todo: pd.DataFrame, sampling: Sampling, out: Path, run_id: str,
              max_batches: int | None = None, source: str | None = None) -> dict:
    """Run one model on ``todo``; write each finished batch at once. Returns counts."""
    ds = _dataset(spec, todo, sampling, source)
    written = failed = 0
    t0 = time.time()
    first = None  # (seconds, rows) at the first finished batch: engine start-up vs steady state
    for i, batch in enumerate(ds.iter_batches(batch_size=None, batch_format="pandas")):
        first = first or (time.time() - t0, len(batch))
        err = (batch["error"].fillna("").astype(str).str.len() > 0).to_numpy() if "error" in batch \
            else np.zeros(len(batch), bool)
        ok, bad = batch[~err], batch[err]
        if len(ok):
            _write_atomic(graded_rows(spec, ok.reset_index(drop=True), todo),
                          out / "table" / slug(spec.id) / f"part-{run_id}-{i:05d}.parquet")
        if len(bad):
            _write_atomic(pd.DataFrame({"query_id": bad["query_id"].to_numpy(), "model": spec.id,
                                        "error": bad["error"].astype(str).to_numpy(), "run": run_id}),
                          out / "errors" / slug(spec.id) / f"errors-{run_id}-{i:05d}.parquet")
        written, failed = written + len(ok), failed + len(bad)
        rate = (written + failed) / max(time.time() - t0, 1e-9)
        log(f"{spec.id}: {written + failed}/{len(todo)} rows ({failed} errors), {rate:.1f} rows/s")
        if max_batches is not None and i + 1 >= max_batches:
            log(f"{spec.id}: stopping after {max_batches} batches (max_batches)")
            break
    return {"model": spec.id, "todo": len(todo), "written": written, "errors": failed, "seconds": time.time() - t0,
            "first_batch_s": first[0] if first else None, "first_batch_rows": first[1] if first else 0}


# ---- the job -------------------------------------------------------------------------------------
def run_job(config: JobConfig, output=None, models=None, max_batches: int | None = None, load_dataset=None) -> dict:
    """Run the job (see the module docstring); returns per-model counts and the output paths."""
    import ray

    out = Path(output or config.output)
    unknown = sorted(set(models or []) - {m.id for m in config.models})
    if unknown:
        raise ConfigError(f"--models names {unknown}, not in the config ({', '.join(m.id for m in config.models)})")
    sources = check_config(config)  # before Ray starts: a bad model fails here, not inside an actor
    queries = load_queries(config, load_dataset)
    specs = [m for m in config.models if models is None or m.id in models]
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 **({} if address else {"num_cpus": os.cpu_count()}))
    ray.data.DataContext.get_current().enable_progress_bars = sys.stderr.isatty()
    sampling = Sampling(**config.sampling.model_dump())
    run_id = time.strftime("%Y%m%d%H%M%S") + "-" + uuid.uuid4().hex[:6]
    stats = []
    for spec in specs:
        done = done_ids(out, spec.id)
        todo = queries[~queries["query_id"].isin(done)].reset_index(drop=True)
        log(f"{spec.id} ({spec.engine}): {len(done)} done, {len(todo)} to run")
        if len(todo):
            stats.append(run_model(spec, todo, sampling, out, run_id, max_batches, sources[spec.id]))
    result = consolidate(out, queries, [m.id for m in config.models])
    result["runs"] = stats
    return result


def consolidate(out: Path, queries: pd.DataFrame, model_ids: list[str]) -> dict:
    """routing_table.parquet (queries with every model), summary.md/.csv, errors.parquet."""
    from .table import RoutingTable

    table_rows = read_parts(out / "table")
    result = {"output": str(out), "rows": int(len(table_rows)), "duplicates": 0, "complete_queries": 0}
    if len(table_rows):
        table_rows = table_rows[table_rows["model"].isin(model_ids) & table_rows["query_id"].isin(queries["query_id"])]
        dup = table_rows.duplicated(["query_id", "model"])
        result["duplicates"] = int(dup.sum())  # 0 by construction; reported so a test can hold us to it
        table_rows = table_rows[~dup.to_numpy()]
        per_query = table_rows.groupby("query_id")["model"].nunique()
        complete = per_query.index[per_query == len(model_ids)]
        if len(complete):
            table = RoutingTable(table_rows[table_rows["query_id"].isin(complete)], source=str(out / "table"))
            table.write(out / "routing_table.parquet")
            result["complete_queries"] = table.n_queries
        (out / "summary.md").write_text(summary_markdown(table_rows))
        (100 * table_rows.groupby(["model", "task"])["correct"].mean()).unstack().to_csv(out / "summary.csv")
    errors = read_parts(out / "errors")
    if len(errors):
        done = set(zip(table_rows["query_id"], table_rows["model"])) if len(table_rows) else set()
        open_err = errors[[(q, m) not in done for q, m in zip(errors["query_id"], errors["model"])]]
        open_err = open_err.drop_duplicates(["query_id", "model"], keep="last")
    else:
        open_err = errors
    result["open_errors"] = int(len(open_err))
    if len(open_err):
        open_err.to_parquet(out / "errors.parquet", index=False)
    elif (out / "errors.parquet").exists():
        (out / "errors.parquet").unlink()
    log(f"{out}: {result['complete_queries']} complete queries × {len(model_ids)} models, "
        f"{result['open_errors']} open errors")
    return result


def summary_markdown(df: pd.DataFrame) -> str:
    """Model × task accuracy (%) with mean cost per query, as a markdown table (paper Table 2)."""
    acc = (100 * df.groupby(["model", "task"])["correct"].mean()).unstack()
    acc["Avg."] = 100 * df.groupby("model")["correct"].mean()
    acc["$/query"] = df.groupby("model")["cost"].mean()
    head = "| model | " + " | ".join(map(str, acc.columns)) + " |"
    lines = [head, "|" + "---|" * (len(acc.columns) + 1)]
    for m, row in acc.iterrows():
        cells = [f"{v:.2f}" if c != "$/query" else f"{v:.3g}" for c, v in row.items()]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---- command line --------------------------------------------------------------------------------
def add_parsers(sub) -> None:
    p = sub.add_parser("build-table", help="run the evaluation job: every model on every query -> routing table")
    p.add_argument("--config", required=True)
    p.add_argument("--output", default=None, help="output folder (default: the config's output)")
    p.add_argument("--models", default=None, help="comma-separated model ids to run (default: all)")
    p.add_argument("--max-batches", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_build_table)
    t = sub.add_parser("make-tiny-model", help="build a tiny random causal LM + BPE tokenizer offline (for CPU runs)")
    t.add_argument("path")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--hidden", type=int, default=64, help="hidden size (head size = hidden / heads)")
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--heads", type=int, default=2)
    t.set_defaults(func=cmd_make_tiny_model)


def cmd_make_tiny_model(a) -> None:
    from .engines import build_tiny_model

    print(build_tiny_model(a.path, a.seed, hidden=a.hidden, layers=a.layers, heads=a.heads))


def cmd_build_table(a) -> None:
    config = load_config(a.config)
    res = run_job(config, a.output, models=a.models.split(",") if a.models else None, max_batches=a.max_batches)
    out = Path(res["output"])
    if (out / "summary.md").exists():
        print((out / "summary.md").read_text())
    print({k: v for k, v in res.items() if k != "runs"})


def main(argv=None) -> int:
    from .cli import main as cli_main

    return cli_main(["build-table", *(sys.argv[1:] if argv is None else argv)])
