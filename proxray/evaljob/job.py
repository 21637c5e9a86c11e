"""The evaluation job: run every model of the pool on every query with Ray Data, grade, price, and
write the routing table.

    proxray build-table --config CONFIG.yaml [--out DIR|URI] [--models a,b]
    ray job submit --working-dir . -- python jobs/build_table.py --config CONFIG.yaml

Every model of a run executes at once: one Ray Data pipeline per model (its own replicas, CPUs, GPUs,
accelerator type), unioned into one streaming execution, so wall time approaches the slowest model's,
not the sum.

Output (a local folder or a pyarrow filesystem URI: ``file://``, ``s3://``, ``gs://``, …; see
``proxray.common.storage``)::

    table/<model slug>/part-*.parquet   the routing table, one file per finished batch, each row with its
                                        ``fingerprint`` (what produced it)
    routing_table.parquet               the same, consolidated: queries that have every model
    summary.md, summary.csv             model × task accuracy (%) and cost, like the paper's Table 2
    errors/<model slug>/*.parquet       rows an engine failed on (never graded); retried by the next run
    errors.parquet                      the failures not yet resolved by a later run

Resumable and lossless, keyed on content: a (model, query) pair is done when ``table/`` holds a row
with that model id, query id and ``fingerprint`` — a hash of the prompt, the answer, the sampling, the
model's source and its prices, read from the rows' own columns (folder names are never trusted). Each
batch is written atomically as soon as it comes back, so an interrupted job loses at most the batches in
flight, a re-run finishes it, adding a model runs only that model, and changing the sampling, a prompt,
a source or a price re-runs exactly the pairs it changes (the old rows stay beside the new ones).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from proxray.pool.engines import Sampling
from proxray.evaljob.grading import grade
from proxray.common.logs import log
from proxray.common.progress import Progress
from proxray.common.naming import slug
from proxray.common.storage import Store
from proxray.pool.spec import PoolModel


# ---- configuration (validated at the boundary) --------------------------------------------------
ModelSpec = PoolModel  # the job's name for the one pool-model spec (proxray.pool.spec)


class SyntheticSet(BaseModel):
    """The embedded synthetic tasks (real text, simulated answers) as a query set."""
    model_config = ConfigDict(extra="forbid")
    n_per_task: int = Field(20, ge=1, description="queries per task (ten tasks)")
    seed: int = Field(0, description="which queries are drawn")


class QuerySetSpec(BaseModel):
    """One set of queries: exactly one of ``path``, ``hf`` or ``synthetic``."""
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, description="written to the table's split column")
    path: str | None = Field(None, description=(
        "JSONL or parquet of {query_id, task, prompt, answer, answer_type}, a local path or a URI "
        "(answer and answer_type may be empty where a grader judges)"))
    hf: str | None = Field(None, description="one of the paper's ten tasks, from the Hugging Face Hub")
    split: str | None = Field(None, description="hf: the data set's split; default its test split")
    n: int | None = Field(None, ge=1, description="hf: a seeded sample of this many queries")
    synthetic: SyntheticSet | None = Field(None, description="the embedded synthetic tasks")

    @model_validator(mode="after")
    def _one_source(self):
        given = [k for k in ("path", "hf", "synthetic") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a query set needs exactly one of path, hf, synthetic (got: {', '.join(given) or 'none'})")
        return self


class SamplingSpec(BaseModel):
    """How every model of the pool generates (part of each row's fingerprint: a change re-runs every pair)."""
    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(0.0, ge=0, description="0 = greedy")
    max_tokens: int = Field(64, ge=1, description="the answer's token limit")
    seed: int = Field(42, description="sampling seed")


DEFAULT_RUBRIC = (
    "You are grading an AI assistant's answer to a user's request.\n\nRequest:\n{question}\n\n"
    "Answer:\n{response}\n\nIs the answer correct and does it do what the request asks? Reply with one line, "
    "'Score: X', where X is a number from 0 (wrong or useless) to 1 (fully correct).")


class GraderSpec(BaseModel):
    """Judge grading: a model of the pool scores each (query, response) pair in [0, 1] from a rubric prompt."""
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, description="the judge: a model id of this config's pool (any engine)")
    rubric: str = Field(DEFAULT_RUBRIC, description="judge prompt with {question} and {response}; the judge "
                        "answers 'Score: X', X in [0, 1] (or 'X/10')")
    apply_to: Literal["unanswered", "all"] = Field(
        "unanswered", description="unanswered: the judge grades the rows without a reference answer, the rest "
        "are graded against their answer; all: the judge grades every row")
    max_tokens: int = Field(16, ge=1, description="the judge's output budget")

    @model_validator(mode="after")
    def _placeholders(self):
        missing = [p for p in ("{question}", "{response}") if p not in self.rubric]
        if missing:
            raise ValueError(f"grader.rubric must contain {' and '.join(missing)}")
        try:
            self.rubric.format(question="q", response="r")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"grader.rubric: only {{question}} and {{response}} may be placeholders "
                             f"(write other braces as {{{{ }}}}): {e}") from None
        return self


class JobConfig(BaseModel):
    """The evaluation job (``proxray build-table --config``; ``jobs/build_table.py`` on a cluster)."""
    model_config = ConfigDict(extra="forbid")
    output: str = Field("out/table", description="folder or URI the table is written to (--out overrides it)")
    models: list[ModelSpec] = Field(min_length=1, description="the pool: every model runs every query (a price "
                                    "is required: the job prices every answer)")
    query_sets: list[QuerySetSpec] = Field(min_length=1, description="the queries")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="how every model generates")
    grader: GraderSpec | None = Field(None, description="judge grading (for queries without reference answers)")

    @model_validator(mode="after")
    def _priced(self):
        unpriced = [m.id for m in self.models if m.price is None]
        if unpriced:
            raise ValueError(f"models {unpriced}: the evaluation job prices every answer; give each model "
                             "price: {input_per_mtok: ..., output_per_mtok: ...}")
        return self

    @model_validator(mode="after")
    def _judge_in_pool(self):
        if self.grader is not None and self.grader.model not in {m.id for m in self.models}:
            raise ValueError(f"grader.model {self.grader.model!r} is not a model of the pool "
                             f"({', '.join(m.id for m in self.models)})")
        return self

    @model_validator(mode="after")
    def _unique_models(self):
        ids = [m.id for m in self.models]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"model ids must be unique; repeated: {', '.join(dup)}")
        slugs = {}
        for i in ids:  # injective by construction (a hash of the id); refused all the same if it ever is not
            if slug(i) in slugs:
                raise ValueError(f"model ids {slugs[slug(i)]!r} and {i!r} map to the same output folder {slug(i)!r}")
            slugs[slug(i)] = i
        return self


class ConfigError(ValueError):
    pass


VOLTA = {"V100"}  # Ray's accelerator names of sm_70 GPUs


def volta_refusal(model_id: str, where: str) -> str:
    """Why a vllm model cannot run on V100 nodes, and the path that does."""
    return (f"model {model_id!r}: engine vllm cannot run on {where}: vLLM 0.29's CUDA 13 wheels (what "
            "ray[llm]==2.60.0 pins) carry no sm_70 (Volta) kernels. On V100 nodes run it with engine: transformers "
            "at dtype float16 in a runtime_env holding a torch built for sm_70, as jobs/configs/paper_pool_v100.yaml "
            "does; or give it accelerator_type A100 or H100")


def _known_accelerators() -> set:
    """Ray's accelerator type names (``ray.util.accelerators``)."""
    from ray.util.accelerators import accelerators

    return {v for k, v in vars(accelerators).items() if k.isupper() and isinstance(v, str)}


def check_config(config: JobConfig, output=None) -> dict:
    """Everything that would otherwise fail inside a Ray actor or half-way through the job, checked
    before Ray starts; every problem is reported at once (``ConfigError``): model sources, engines and
    their kwargs, accelerator names, local query files, the output location. Returns ``{model id:
    source}`` with local folders resolved to absolute paths (Ray workers may run in another directory)."""
    from proxray.pool.engines import check_models

    sources, problems = check_models(config.models, config.sampling.max_tokens)
    known = _known_accelerators() if any(m.accelerator_type for m in config.models) else set()
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


def cluster_accelerators() -> set:
    """Accelerator types this Ray cluster has or can start: those of its live nodes, and those of the
    node types in the autoscaler's config (``~/ray_bootstrap_config.yaml`` on a ``ray up`` head, where
    a submitted job's driver runs)."""
    import ray

    types = {k.split(":", 1)[1] for n in ray.nodes() if n.get("Alive")
             for k in n.get("Resources", {}) if k.startswith("accelerator_type:")}
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


def load_config(path) -> JobConfig:
    """Read and validate a job YAML; errors name the file, the field, the value and the rule."""
    from proxray.common.yamlconfig import load_yaml_model

    return load_yaml_model(path, JobConfig, "job config", ConfigError)


# ---- queries -------------------------------------------------------------------------------------
def load_queries(config: JobConfig, load_dataset=None) -> pd.DataFrame:
    from proxray.data.querysets import hf_queries, read_queries, synthetic_queries, validate_queries

    frames = []
    for i, qs in enumerate(config.query_sets):
        if qs.path is not None:
            df = read_queries(qs.path)
        elif qs.hf is not None:
            df = hf_queries(qs.hf, qs.split, qs.n, seed=config.sampling.seed, load_dataset=load_dataset)
        else:
            df = synthetic_queries(qs.synthetic.n_per_task, qs.synthetic.seed)
        df["split"] = qs.name or qs.hf or (Path(qs.path.split("?")[0]).stem if qs.path else "synthetic")
        frames.append(df)
    return validate_queries(pd.concat(frames, ignore_index=True), "query sets")


# ---- output layout and content keys --------------------------------------------------------------
def fingerprints(spec: ModelSpec, queries: pd.DataFrame, sampling: Sampling) -> np.ndarray:
    """What produced a (model, query) row, one hash per query: the prompt, the answer it is graded
    against, the sampling, the model's source and its prices. A stored row counts as done only while
    its fingerprint is still the one the config gives."""
    head = json.dumps({"model": spec.id, "source": spec.source or spec.id, "price_in": spec.price.input_per_mtok,
                       "price_out": spec.price.output_per_mtok, "sampling": vars(sampling)}, sort_keys=True)
    answers = queries["answer"] if "answer" in queries else pd.Series([""] * len(queries))
    types = queries["answer_type"] if "answer_type" in queries else pd.Series([""] * len(queries))
    return np.array([hashlib.sha256("\x1f".join((head, p, str(a), str(t))).encode()).hexdigest()[:20]
                     for p, a, t in zip(queries["prompt"], answers, types)], dtype=object)


def expected_keys(specs, queries: pd.DataFrame, sampling: Sampling, grader: GraderSpec | None = None) -> pd.DataFrame:
    """(model, query_id, fingerprint) of every pair the config asks for, with ``gen_fingerprint`` (what
    produced the response) and ``judged``. A judged row's fingerprint also hashes the grader (judge
    model, its source and prices, the rubric), so a new rubric re-judges stored responses without
    generating them again; a reference-graded row's fingerprint is its generation's."""
    judged = judged_mask(grader, queries)
    gfp = grader_fingerprint(grader, specs, sampling)
    frames = []
    for s in specs:
        gen = fingerprints(s, queries, sampling)
        final = np.array([hashlib.sha256(f"{g}\x1f{gfp}".encode()).hexdigest()[:20] if j else g
                          for g, j in zip(gen, judged)], dtype=object)
        frames.append(pd.DataFrame({"model": s.id, "query_id": queries["query_id"].to_numpy(), "fingerprint": final,
                                    "gen_fingerprint": gen, "judged": judged}))
    return pd.concat(frames, ignore_index=True)


def judged_mask(grader: GraderSpec | None, queries: pd.DataFrame) -> np.ndarray:
    """Which queries the judge grades: none without a grader; with one, those without a reference answer
    (``apply_to: unanswered``) or all."""
    if grader is None:
        return np.zeros(len(queries), bool)
    if grader.apply_to == "all":
        return np.ones(len(queries), bool)
    return (queries["answer"].astype(str) == "").to_numpy()


def grader_fingerprint(grader: GraderSpec | None, specs, sampling: Sampling) -> str:
    if grader is None:
        return ""
    judge = next((s for s in specs if s.id == grader.model), None)
    head = {"grader": grader.model_dump(), "seed": sampling.seed}
    if judge is not None:
        head.update(source=judge.source or judge.id, price_in=judge.price.input_per_mtok,
                    price_out=judge.price.output_per_mtok)
    return hashlib.sha256(json.dumps(head, sort_keys=True).encode()).hexdigest()[:20]


def current_rows(rows: pd.DataFrame, keys: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``rows`` whose (model, query_id, fingerprint) is one the config asks for now; rows
    written before fingerprints existed, or for another prompt / sampling / source / price, are not."""
    if not len(rows) or "fingerprint" not in rows:
        return rows.iloc[0:0]
    return rows.merge(keys, on=["model", "query_id", "fingerprint"], how="inner")


def read_parts(folder) -> pd.DataFrame:
    """Every parquet file below ``folder`` (a local path or a filesystem URI), concatenated."""
    return Store(folder).read_parts("")


# ---- running the pool ----------------------------------------------------------------------------
class EngineWorker:
    """Ray Data actor: one engine per replica; a batch in, one output row per input row out.
    A batch that fails is retried row by row, so one bad row costs only itself (``error`` column).
    Each row also says where it ran (``node_id``), which the driver reports and does not store."""

    def __init__(self, spec: dict, sampling: dict):
        import ray

        from proxray.pool.engines import make_engine

        self.spec = ModelSpec(**spec)
        self.engine = make_engine(self.spec)
        self.sampling = Sampling(**sampling)
        self.node_id = ray.get_runtime_context().get_node_id()

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
        return pd.DataFrame({"model": self.spec.id, "query_id": batch["query_id"].to_numpy(),
                             "response": [o["response"] for o in outs],
                             "input_tokens": [int(o["input_tokens"]) for o in outs],
                             "output_tokens": [int(o["output_tokens"]) for o in outs],
                             "error": errors, "node_id": self.node_id})


def _dataset(spec: ModelSpec, todo: pd.DataFrame, sampling: Sampling, source: str | None = None):
    """One model's pipeline: its queries through its engine replicas, on the resources it asks for."""
    import ray

    cols = [c for c in ("query_id", "task", "prompt", "answer", "answer_type", "difficulty") if c in todo]
    items = [{**r, "pool_model": spec.id} for r in todo[cols].to_dict("records")]  # not "model": ray.data.llm's LoRA key
    ds = ray.data.from_items(items, override_num_blocks=max(1, min(len(items) // spec.batch_size, 64)))
    if spec.engine == "vllm":
        from proxray.pool.engines import vllm_output_row, vllm_processor

        # failed rows skip the processor's postprocess: map every row to the output columns after it
        return vllm_processor(spec, sampling, source)(ds).map(vllm_output_row, num_cpus=spec.cpus(1.0))
    if source:
        spec = spec.model_copy(update={"source": source})
    where = {"num_gpus": spec.gpus} if spec.gpus else {}
    if spec.accelerator_type:
        where["accelerator_type"] = spec.accelerator_type
    if spec.runtime_env:  # e.g. a torch built for the node's GPUs (jobs/configs/paper_pool_v100.yaml)
        where["runtime_env"] = spec.runtime_env
    return ds.map_batches(
        EngineWorker, fn_constructor_kwargs={"spec": spec.model_dump(), "sampling": vars(sampling)},
        batch_size=spec.batch_size, batch_format="pandas", compute=ray.data.ActorPoolStrategy(size=spec.replicas),
        num_cpus=spec.cpus(1.0), **where)  # Ray Data restarts a dead actor and retries its batch (max_restarts=-1)


def graded_rows(spec: ModelSpec, out: pd.DataFrame, queries: pd.DataFrame, fingerprint: pd.Series,
                correct=None, grader: str = "reference", judge_cost=0.0) -> pd.DataFrame:
    """Engine output joined with its queries: graded (against the reference answer, or ``correct`` from a
    judge), priced, fingerprinted, in the canonical table columns."""
    q = queries.loc[out["query_id"]]
    if correct is None:
        correct = [grade(r, a, t) for r, a, t in zip(out["response"], q["answer"], q["answer_type"])]
    n_in = out["input_tokens"].to_numpy(dtype=np.int64)
    n_out = out["output_tokens"].to_numpy(dtype=np.int64)
    return pd.DataFrame({
        "query_id": out["query_id"].to_numpy(), "task": q["task"].to_numpy(), "prompt": q["prompt"].to_numpy(),
        "model": spec.id, "correct": np.asarray(correct, dtype=np.float64),
        "cost": spec.cost(n_in, n_out),  # USD from the engine's own token counts
        "split": q["split"].to_numpy(), "response": out["response"].astype(str).to_numpy(),
        "input_tokens": n_in, "output_tokens": n_out, "grader": grader,
        "judge_cost": np.broadcast_to(np.asarray(judge_cost, dtype=np.float64), len(out)).copy(),
        "fingerprint": fingerprint.loc[out["query_id"]].to_numpy()})


_SCORE = re.compile(r"score\s*(?:is|[:=])?\s*\**\s*(\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?", re.I)


def parse_score(text) -> float | None:
    """A judge's score in [0, 1] from its output: the last ``Score: X`` (X in [0, 1], or ``X/N``), else a
    reply that is only a number in [0, 1]; None when there is no such score."""
    if not isinstance(text, str):
        return None
    hits = _SCORE.findall(text)
    if hits:
        num, den = hits[-1]
        v = float(num) / float(den) if den and float(den) > 0 else float(num)
        return v if 0.0 <= v <= 1.0 else None
    bare = text.strip().strip("*.").strip()
    try:
        v = float(bare)
    except ValueError:
        return None
    return v if 0.0 <= v <= 1.0 else None


def run_pool(specs, todos: dict, queries: pd.DataFrame, keys: pd.DataFrame, sampling: Sampling, store: Store,
             run_id: str, sources: dict, max_batches: int | None = None) -> list[dict]:
    """Run every model of ``specs`` on its ``todos[id]`` at once (one unioned Ray Data execution); write
    each finished batch to ``store`` as it comes back: graded rows to ``table/``, responses the judge
    grades to ``generated/``. Returns per-model counts, in ``specs`` order."""
    specs = [s for s in specs if len(todos[s.id])]
    if not specs:
        return []
    by_id = {s.id: s for s in specs}
    branches = [_dataset(s, todos[s.id], sampling, sources.get(s.id)) for s in specs]
    ds = branches[0].union(*branches[1:]) if len(branches) > 1 else branches[0]
    fps = {s.id: keys[keys["model"] == s.id].set_index("query_id")["fingerprint"] for s in specs}
    gen_fps = {s.id: keys[keys["model"] == s.id].set_index("query_id")["gen_fingerprint"] for s in specs}
    judged_ids = set(keys.loc[keys["judged"], "query_id"])
    qidx = queries.set_index("query_id")
    progress = Progress({s.id: len(todos[s.id]) for s in specs})
    stats = {s.id: {"model": s.id, "todo": len(todos[s.id]), "written": 0, "errors": 0, "seconds": None,
                    "first_batch_s": None, "first_batch_rows": 0, "nodes": set()} for s in specs}
    t0 = time.time()
    for i, batch in enumerate(ds.iter_batches(batch_size=None, batch_format="pandas")):
        for model_id, part in batch.groupby("model", sort=False):
            spec, st = by_id[model_id], stats[model_id]
            part = part.reset_index(drop=True)
            if st["first_batch_s"] is None:  # engine start-up vs steady state
                st["first_batch_s"], st["first_batch_rows"] = time.time() - t0, len(part)
            if "node_id" in part:
                st["nodes"] |= set(part["node_id"].dropna())
            err = (part["error"].fillna("").astype(str).str.len() > 0).to_numpy() if "error" in part \
                else np.zeros(len(part), bool)
            ok, bad = part[~err].reset_index(drop=True), part[err]
            name = f"part-{run_id}-{i:05d}.parquet"
            to_judge = ok["query_id"].isin(judged_ids).to_numpy() if judged_ids else np.zeros(len(ok), bool)
            if (~to_judge).any():
                store.write_parquet(graded_rows(spec, ok[~to_judge], qidx, fps[model_id]),
                                    f"table/{slug(model_id)}/{name}")
            if to_judge.any():  # the judge grades these after generation: keep the responses meanwhile
                g = ok[to_judge]
                store.write_parquet(pd.DataFrame({
                    "model": model_id, "query_id": g["query_id"].to_numpy(), "response": g["response"].astype(str).to_numpy(),
                    "input_tokens": g["input_tokens"].to_numpy(dtype=np.int64),
                    "output_tokens": g["output_tokens"].to_numpy(dtype=np.int64),
                    "fingerprint": gen_fps[model_id].loc[g["query_id"]].to_numpy()}), f"generated/{slug(model_id)}/{name}")
            if len(bad):
                store.write_parquet(pd.DataFrame({
                    "query_id": bad["query_id"].to_numpy(), "model": model_id,
                    "fingerprint": fps[model_id].loc[bad["query_id"]].to_numpy(),
                    "error": bad["error"].astype(str).to_numpy(), "run": run_id}),
                    f"errors/{slug(model_id)}/errors-{run_id}-{i:05d}.parquet")
            st["written"] += len(ok)
            st["errors"] += len(bad)
            st["seconds"] = time.time() - t0
            progress.update(model_id, len(ok), len(bad))
        if max_batches is not None and i + 1 >= max_batches:
            log(f"stopping after {max_batches} batches (max_batches)")
            break
    return [{**st, "nodes": sorted(st["nodes"])} for st in stats.values()]


# ---- the job -------------------------------------------------------------------------------------
def run_job(config: JobConfig, output=None, models=None, max_batches: int | None = None, load_dataset=None) -> dict:
    """Run the job (see the module docstring); returns per-model counts and the output location."""
    import ray

    unknown = sorted(set(models or []) - {m.id for m in config.models})
    if unknown:
        raise ConfigError(f"--models names {unknown}, not in the config ({', '.join(m.id for m in config.models)})")
    sources = check_config(config, output)  # before Ray starts: a bad model fails here, not inside an actor
    store = Store(output or config.output)
    queries = load_queries(config, load_dataset)
    unanswered = int((queries["answer"] == "").sum())
    if unanswered and config.grader is None:
        raise ConfigError(f"{unanswered} of {len(queries)} queries have no reference answer: add a grader section "
                          "(grader: {model: <a pool model id>}) so a judge grades them")
    specs = [m for m in config.models if models is None or m.id in models]
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 **({} if address else {"num_cpus": os.cpu_count()}))
    check_cluster(specs)
    ray.data.DataContext.get_current().enable_progress_bars = False  # one display for the job: Progress
    sampling = Sampling(**config.sampling.model_dump())
    keys = expected_keys(config.models, queries, sampling, config.grader)
    done = current_rows(store.read_parts("table"), keys)
    graded_keys = set(zip(done["model"], done["query_id"])) if len(done) else set()
    done_keys = set(graded_keys)
    judging = bool(keys["judged"].any())
    if judging:  # responses already generated and waiting for the judge are not generated again
        generated = _generated(store, keys)
        done_keys |= set(zip(generated["model"], generated["query_id"]))
    todos = {}
    for spec in specs:
        todo = ~pd.Series([(spec.id, q) in done_keys for q in queries["query_id"]], dtype=bool).to_numpy()
        todos[spec.id] = queries[todo].reset_index(drop=True)
        log(f"{spec.id} ({spec.engine}): {len(queries) - int(todo.sum())} done, {int(todo.sum())} to run")
    run_id = time.strftime("%Y%m%d%H%M%S") + "-" + uuid.uuid4().hex[:6]
    stats = run_pool(specs, todos, queries, keys, sampling, store, run_id, sources, max_batches)
    judge_stats = None
    if judging and max_batches is None:  # a run cut short (max_batches) leaves the judging to the next run
        judge_stats = run_judge(config, [s.id for s in specs], queries, keys, sampling, store, run_id, sources,
                                graded_keys)
    result = consolidate(store, keys)
    result["runs"] = stats
    if judge_stats is not None:
        result["judge"] = judge_stats
    return result


def _generated(store: Store, keys: pd.DataFrame) -> pd.DataFrame:
    """Responses in ``generated/`` whose generation fingerprint the config gives now, one per (model, query)."""
    rows = store.read_parts("generated")
    if not len(rows):
        return pd.DataFrame(columns=["model", "query_id", "response", "input_tokens", "output_tokens", "fingerprint"])
    gen_keys = keys.loc[keys["judged"], ["model", "query_id", "gen_fingerprint"]].rename(
        columns={"gen_fingerprint": "fingerprint"})
    return current_rows(rows, gen_keys).drop_duplicates(["model", "query_id"], keep="last").reset_index(drop=True)


def run_judge(config: JobConfig, model_ids, queries: pd.DataFrame, keys: pd.DataFrame, sampling: Sampling,
              store: Store, run_id: str, sources: dict, done_keys: set) -> dict:
    """Judge grading: every generated response of ``model_ids`` that has no judged row yet goes through the
    judge model (its own engine, one Ray Data pipeline) with the rubric prompt; the score becomes
    ``correct``, the judge's tokens at its prices ``judge_cost``, ``grader`` = ``judge:<model>``. A reply
    without a score is an error row (retried by the next run), never a guess. ``done_keys``: the (model,
    query) pairs the table already holds current rows for (read once by ``run_job``; generation writes only
    reference-graded rows there, never judged ones)."""
    grader = config.grader
    judge = next(m for m in config.models if m.id == grader.model)
    pending = _generated(store, keys)
    pending = pending[[(m, q) not in done_keys and m in model_ids
                       for m, q in zip(pending["model"], pending["query_id"])]].reset_index(drop=True)
    stats = {"judge": judge.id, "todo": int(len(pending)), "graded": 0, "unparsed": 0, "judge_cost": 0.0}
    if not len(pending):
        return stats
    qidx = queries.set_index("query_id")
    jid = [hashlib.sha256(f"{m}\x1f{q}".encode()).hexdigest()[:16] for m, q in zip(pending["model"], pending["query_id"])]
    pending["jid"] = jid
    by_jid = pending.set_index("jid")
    prompts = [grader.rubric.format(question=qidx.at[q, "prompt"], response=r)
               for q, r in zip(pending["query_id"], pending["response"])]
    items = pd.DataFrame({"query_id": jid, "task": qidx.loc[pending["query_id"], "task"].to_numpy(), "prompt": prompts})
    judge_sampling = Sampling(temperature=0.0, max_tokens=grader.max_tokens, seed=sampling.seed)
    log(f"judge {judge.id}: grading {len(items)} responses")
    ds = _dataset(judge, items, judge_sampling, sources.get(judge.id))
    specs = {m.id: m for m in config.models}
    fps = {m: keys[keys["model"] == m].set_index("query_id")["fingerprint"] for m in set(pending["model"])}
    progress = Progress({f"judge {judge.id}": len(items)})
    for i, batch in enumerate(ds.iter_batches(batch_size=None, batch_format="pandas")):
        batch = batch.reset_index(drop=True)
        err = batch["error"].fillna("").astype(str).to_numpy() if "error" in batch else np.full(len(batch), "")
        scores = [parse_score(r) if not e else None for r, e in zip(batch["response"], err)]
        jcost = judge.cost(batch["input_tokens"].to_numpy(), batch["output_tokens"].to_numpy())
        src = by_jid.loc[batch["query_id"]].reset_index()
        ok = np.array([v is not None for v in scores])
        name = f"part-{run_id}-judge-{i:05d}.parquet"
        for model_id in sorted(set(src["model"])):
            mine = (src["model"] == model_id).to_numpy()
            good, bad = mine & ok, mine & ~ok
            if good.any():
                out = src.loc[good, ["query_id", "response", "input_tokens", "output_tokens"]].reset_index(drop=True)
                store.write_parquet(graded_rows(specs[model_id], out, qidx, fps[model_id],
                                                correct=np.asarray(scores, dtype=object)[good].astype(float),
                                                grader=f"judge:{judge.id}", judge_cost=jcost[good]),
                                    f"table/{slug(model_id)}/{name}")
            if bad.any():
                why = [e or f"judge output has no score in [0, 1]: {str(r)[:80]!r}"
                       for e, r in zip(err[bad], batch["response"].to_numpy()[bad])]
                store.write_parquet(pd.DataFrame({
                    "query_id": src.loc[bad, "query_id"].to_numpy(), "model": model_id,
                    "fingerprint": fps[model_id].loc[src.loc[bad, "query_id"]].to_numpy(),
                    "error": why, "run": run_id}), f"errors/{slug(model_id)}/errors-{run_id}-judge-{i:05d}.parquet")
        stats["graded"] += int(ok.sum())
        stats["unparsed"] += int((~ok).sum())
        stats["judge_cost"] += float(jcost.sum())
        progress.update(f"judge {judge.id}", int(ok.sum()), int((~ok).sum()))
    log(f"judge {judge.id}: {stats['graded']} graded, {stats['unparsed']} without a score, "
        f"{stats['judge_cost']:.3g} USD")
    return stats


def consolidate(store: Store, keys: pd.DataFrame) -> dict:
    """routing_table.parquet (queries with every model), summary.md/.csv, errors.parquet — from the
    rows whose fingerprints the config gives now, each file written atomically."""
    from proxray.data.table import RoutingTable

    model_ids = list(dict.fromkeys(keys["model"]))
    parts = store.read_parts("table")
    table_rows = current_rows(parts, keys)
    result = {"output": store.uri, "rows": int(len(table_rows)), "stale_rows": int(len(parts) - len(table_rows)),
              "duplicates": 0, "complete_queries": 0}
    if len(table_rows):
        dup = table_rows.duplicated(["query_id", "model"], keep="last")
        result["duplicates"] = int(dup.sum())  # 0 by construction; reported so a test can hold us to it
        table_rows = table_rows[~dup.to_numpy()]
        per_query = table_rows.groupby("query_id")["model"].nunique()
        complete = per_query.index[per_query == len(model_ids)]
        if len(complete):
            table = RoutingTable(table_rows[table_rows["query_id"].isin(complete)], source=store.path("table"))
            store.write_parquet(table.df, "routing_table.parquet")
            result["complete_queries"] = table.n_queries
        store.write_text("summary.md", summary_markdown(table_rows))
        store.write_text("summary.csv", (100 * table_rows.groupby(["model", "task"])["correct"].mean()).unstack().to_csv())
    errors = current_rows(store.read_parts("errors"), keys)
    if len(errors):
        done = set(zip(table_rows["query_id"], table_rows["model"])) if len(table_rows) else set()
        open_err = errors[[(q, m) not in done for q, m in zip(errors["query_id"], errors["model"])]]
        open_err = open_err.drop_duplicates(["query_id", "model"], keep="last")
    else:
        open_err = errors
    result["open_errors"] = int(len(open_err))
    if len(open_err):
        store.write_parquet(open_err, "errors.parquet")
    else:
        store.delete("errors.parquet")
    log(f"{store.uri}: {result['complete_queries']} complete queries × {len(model_ids)} models, "
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
    from proxray.common.cliargs import flag_with_old_positional, renamed_flag

    p = sub.add_parser("build-table", help="run the evaluation job: every model on every query -> routing table",
                       description="Run the evaluation job on this machine or the running Ray cluster: every model "
                       "of the config's pool on every query, graded and priced, written as a routing table.")
    p.add_argument("--config", required=True, help="job YAML, e.g. jobs/configs/cpu_tiny.yaml")
    p.add_argument("--out", default=None, help="output folder or filesystem URI, e.g. s3://bucket/run "
                   "(default: the config's output)")
    renamed_flag(p, "--output", "--out")
    p.add_argument("--models", default=None, help="comma-separated model ids to run (default: all)")
    p.add_argument("--max-batches", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_build_table)
    t = sub.add_parser("make-tiny-model", help="build a tiny random causal LM + BPE tokenizer offline (for CPU runs)",
                       description="Write a tiny random causal LM with its BPE tokenizer, made offline, that vLLM "
                       "on a CPU loads like any Hugging Face folder (for tests and demos).")
    flag_with_old_positional(t, "--out", help="folder to write the model into")
    t.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    t.add_argument("--hidden", type=int, default=64, help="hidden size (head size = hidden / heads)")
    t.add_argument("--layers", type=int, default=2, help="transformer layers")
    t.add_argument("--heads", type=int, default=2, help="attention heads (vLLM on a CPU needs head size 32, 64, 80, …)")
    t.set_defaults(func=cmd_make_tiny_model)


def cmd_make_tiny_model(a) -> None:
    from proxray.pool.engines import build_tiny_model

    print(build_tiny_model(a.out, a.seed, hidden=a.hidden, layers=a.layers, heads=a.heads))


def cmd_build_table(a) -> None:
    config = load_config(a.config)
    res = run_job(config, a.out, models=a.models.split(",") if a.models else None, max_batches=a.max_batches)
    out = Store(res["output"])
    if out.exists("summary.md"):
        print(out.read_text("summary.md"))
    print({k: v for k, v in res.items() if k != "runs"})
