"""Running the pool: every model's queries through its engine replicas (one Ray Data pipeline per model, unioned
into one streaming execution), each finished batch graded, priced and written as it comes back."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from proxray.common.naming import slug
from proxray.common.progress import Progress
from proxray.common.logs import log
from proxray.common.storage import Store
from proxray.evaljob.grading import grade
from proxray.pool.spec import PoolModel, Sampling


LIMITERS: dict = {}  # model id -> its RateLimiter actor, held by the driver while the job runs


class EngineWorker:
    """Ray Data actor: one engine per replica; a batch in, one output row per input row out.
    A batch that fails is retried row by row, so one bad row costs only itself (``error`` column).
    Each row also says where it ran (``node_id``), which the driver reports and does not store."""

    def __init__(self, spec: dict, sampling: dict, limiter=None):
        import ray

        from proxray.pool.engines import make_engine

        self.spec = PoolModel(**spec)
        self.engine = make_engine(self.spec, limiter)
        self.sampling = Sampling(**sampling)
        self.node_id = ray.get_runtime_context().get_node_id()

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        rows = batch.to_dict("records")
        try:
            outs = self.engine.generate(rows, self.sampling)
            errors = [o.get("error", "") for o in outs]  # an engine may fail one row without raising (openai)
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


def pipeline(spec: PoolModel, todo: pd.DataFrame, sampling: Sampling, source: str | None = None):
    """One model's pipeline: its queries through its engine replicas, on the resources it asks for."""
    import ray

    cols = [c for c in ("query_id", "task", "prompt", "answer", "answer_type", "difficulty") if c in todo]
    items = [{**r, "pool_model": spec.id} for r in todo[cols].to_dict("records")]  # not "model": ray.data.llm's LoRA key
    ds = ray.data.from_items(items, override_num_blocks=max(1, min(len(items) // spec.batch_size, 64)))
    if spec.engine == "vllm":
        from proxray.pool.vllm_adapter import vllm_output_row, vllm_processor

        # failed rows skip the processor's postprocess: map every row to the output columns after it
        return vllm_processor(spec, sampling, source)(ds).map(vllm_output_row, num_cpus=spec.cpus(1.0))
    if source:
        spec = spec.model_copy(update={"source": source})
    where = {"num_gpus": spec.gpus} if spec.gpus else {}
    if spec.accelerator_type:
        where["accelerator_type"] = spec.accelerator_type
    if spec.runtime_env:  # e.g. a torch built for the node's GPUs (jobs/configs/paper_pool_v100.yaml)
        where["runtime_env"] = spec.runtime_env
    kwargs = {"spec": spec.model_dump(), "sampling": sampling.model_dump()}
    if spec.engine == "openai" and spec.rate_limit is not None:  # one limiter for all of the model's workers
        from proxray.pool.openai_engine import RateLimiter

        kwargs["limiter"] = LIMITERS[spec.id] = ray.remote(RateLimiter).options(num_cpus=0).remote(
            spec.rate_limit.requests_per_minute, spec.rate_limit.tokens_per_minute)
    return ds.map_batches(
        EngineWorker, fn_constructor_kwargs=kwargs,
        batch_size=spec.batch_size, batch_format="pandas", compute=ray.data.ActorPoolStrategy(size=spec.replicas),
        num_cpus=spec.cpus(1.0), **where)  # Ray Data restarts a dead actor and retries its batch (max_restarts=-1)


def graded_rows(spec: PoolModel, out: pd.DataFrame, queries: pd.DataFrame, fingerprint: pd.Series,
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


def run_pool(specs, todos: dict, queries: pd.DataFrame, keys: pd.DataFrame, sampling: Sampling, store: Store,
             run_id: str, sources: dict, max_batches: int | None = None) -> list[dict]:
    """Run every model of ``specs`` on its ``todos[id]`` at once (one unioned Ray Data execution); write
    each finished batch to ``store`` as it comes back: graded rows to ``table/``, responses the judge
    grades to ``generated/``. Returns per-model counts, in ``specs`` order."""
    LIMITERS.clear()  # the previous run's limiters
    specs = [s for s in specs if len(todos[s.id])]
    if not specs:
        return []
    by_id = {s.id: s for s in specs}
    branches = [pipeline(s, todos[s.id], sampling, sources.get(s.id)) for s in specs]
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
