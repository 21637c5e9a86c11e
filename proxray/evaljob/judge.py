"""Judge grading: a model of the pool scores the generated responses that have no reference answer (or all of
them) from a rubric prompt; the score becomes ``correct``."""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from proxray.common.logs import log
from proxray.common.naming import slug
from proxray.common.progress import Progress
from proxray.common.storage import Store
from proxray.evaljob.config import JobConfig
from proxray.evaljob.grading import parse_score
from proxray.evaljob.keys import current_rows
from proxray.evaljob.run import graded_rows, pipeline
from proxray.pool.spec import Sampling


def generated_rows(store: Store, keys: pd.DataFrame) -> pd.DataFrame:
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
    pending = generated_rows(store, keys)
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
    ds = pipeline(judge, items, judge_sampling, sources.get(judge.id))
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
