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

The job's stages, each a module of this package: ``config`` (validated at the boundary), ``preflight`` (checks
before Ray starts and once connected), ``keys`` (content keys), ``run`` (the pool's pipelines), ``judge`` (judge
grading), ``consolidate`` (the table, the summary and the open errors). This module runs them in order.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pandas as pd

from proxray.common.logs import log
from proxray.common.storage import Store
from proxray.evaljob.config import ConfigError, JobConfig
from proxray.evaljob.consolidate import consolidate
from proxray.evaljob.judge import generated_rows, run_judge
from proxray.evaljob.keys import current_rows, expected_keys
from proxray.evaljob.preflight import check_cluster, check_config
from proxray.evaljob.run import run_pool


def load_queries(config: JobConfig, load_dataset=None) -> pd.DataFrame:
    from proxray.data.querysets import hf_queries, read_queries, synthetic_queries, validate_queries

    frames = []
    for i, qs in enumerate(config.query_sets):
        if qs.path is not None:
            df = read_queries(qs.path)
        elif qs.hf is not None:
            df = hf_queries(qs.hf, qs.split, qs.n, seed=config.sampling.seed, load_dataset=load_dataset)
        else:
            df = synthetic_queries(qs.synthetic.n_per_task, qs.synthetic.seed, qs.synthetic.tasks)
        if qs.n is not None and len(df) > qs.n:  # a seeded sample (hf sets are sampled as they are read)
            df = df.sample(n=qs.n, random_state=config.sampling.seed).sort_index()
        df["split"] = qs.name or qs.hf or (Path(qs.path.split("?")[0]).stem if qs.path else "synthetic")
        frames.append(df)
    return validate_queries(pd.concat(frames, ignore_index=True), "query sets")


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
    keys = expected_keys(config.models, queries, config.sampling, config.grader)
    done = current_rows(store.read_parts("table"), keys)
    graded_keys = set(zip(done["model"], done["query_id"])) if len(done) else set()
    done_keys = set(graded_keys)
    judging = bool(keys["judged"].any())
    if judging:  # responses already generated and waiting for the judge are not generated again
        generated = generated_rows(store, keys)
        done_keys |= set(zip(generated["model"], generated["query_id"]))
    todos = {}
    for spec in specs:
        todo = ~pd.Series([(spec.id, q) in done_keys for q in queries["query_id"]], dtype=bool).to_numpy()
        todos[spec.id] = queries[todo].reset_index(drop=True)
        log(f"{spec.id} ({spec.engine}): {len(queries) - int(todo.sum())} done, {int(todo.sum())} to run")
    run_id = time.strftime("%Y%m%d%H%M%S") + "-" + uuid.uuid4().hex[:6]
    stats = run_pool(specs, todos, queries, keys, config.sampling, store, run_id, sources, max_batches)
    judge_stats = None
    if judging and max_batches is None:  # a run cut short (max_batches) leaves the judging to the next run
        judge_stats = run_judge(config, [s.id for s in specs], queries, keys, config.sampling, store, run_id, sources,
                                graded_keys)
    result = consolidate(store, keys)
    result["runs"] = stats
    if judge_stats is not None:
        result["judge"] = judge_stats
    return result
