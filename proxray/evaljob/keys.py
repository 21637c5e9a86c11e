"""Content keys: what produced each (model, query) row of the table. A stored row counts as done only while its
``fingerprint`` is still the one the config gives, so a changed prompt, answer, sampling, source, price or rubric
re-runs exactly the pairs it changes."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd

from proxray.evaljob.config import GraderSpec
from proxray.pool.spec import PoolModel, Sampling


def fingerprints(spec: PoolModel, queries: pd.DataFrame, sampling: Sampling) -> np.ndarray:
    """What produced a (model, query) row, one hash per query: the prompt, the answer it is graded
    against, the sampling, the model's source (and endpoint) and its prices. A stored row counts as done only while
    its fingerprint is still the one the config gives."""
    what = {"model": spec.id, "source": spec.source or spec.id, "price_in": spec.price.input_per_mtok,
            "price_out": spec.price.output_per_mtok, "sampling": sampling.model_dump()}
    if spec.base_url:  # an endpoint's model: another endpoint re-runs it
        what["base_url"] = spec.base_url.rstrip("/")
    head = json.dumps(what, sort_keys=True)
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
