"""``proxray fit --encoder auto``: the encoder chosen by evidence on the user's own table.

The static encoder routes at a pass-through's cost; MiniLM (the default) costs ~7 ms a text more and is, on some
tables, the better router on unfamiliar tasks (``research/static-encoder.md``). ``choose_encoder`` measures both on
the table it is given, as that study does, bounded in size: a seeded sample of at most ``max_queries`` queries
(every task kept, in proportion), each of up to ``held_out`` tasks (the largest first) held out in turn under the router's protocol
(KMeans: leave-task-out; kNN: few-shot-outlier), Prox with its shipped temperature, one seed. It keeps the static
encoder when its mean overall score (normalized AUC in %, accuracy at λ = 0 for a table without cost) is within
``tolerance_pp`` of MiniLM's, and returns the comparison, which the router's artifact records.
"""
from __future__ import annotations

import time

import numpy as np

from proxray.common.logs import log
from proxray.embeddings.encoder import STATIC, SentenceEncoder, encoder_id
from proxray.experiments.protocols import evaluate
from proxray.routing.registry import DEFAULT_ROUTER, family

CANDIDATES = (STATIC, None)  # the cheap one first: it is kept when it is good enough
MIN_PER_TASK = 10  # a task with fewer queries is never held out


def check_choice_args(tolerance_pp: float, max_queries: int, held_out: int) -> None:
    """The settings' errors before anything is encoded."""
    if not (np.isfinite(tolerance_pp) and tolerance_pp >= 0):
        raise ValueError(f"--encoder-tolerance {tolerance_pp!r}: must be a number of percentage points >= 0")
    if int(max_queries) < 100:
        raise ValueError(f"--encoder-sample {max_queries!r}: must be at least 100 queries")
    if int(held_out) < 1:
        raise ValueError(f"held_out={held_out!r}: must be >= 1")


def sample_rows(tasks: np.ndarray, max_queries: int, seed: int = 0) -> np.ndarray:
    """At most ``max_queries`` row indices, every task kept in proportion to its size (at least one row each)."""
    tasks = np.asarray(tasks)
    if len(tasks) <= max_queries:
        return np.arange(len(tasks))
    rng = np.random.default_rng(seed)
    rows = []
    for t in sorted(set(tasks)):
        idx = np.flatnonzero(tasks == t)
        take = max(1, int(round(max_queries * len(idx) / len(tasks))))
        rows.append(rng.choice(idx, size=min(take, len(idx)), replace=False))
    return np.sort(np.concatenate(rows))


def choose_encoder(prompts, acc, cost, tasks, router: str = DEFAULT_ROUTER, tolerance_pp: float = 0.5,
                   max_queries: int = 3000, held_out: int = 8, seed: int = 42, k: int | None = None,
                   n_clusters: int | None = None) -> dict:
    """{"chosen": the encoder setting (None: MiniLM), "chosen_id", "tolerance_pp", "scores": {encoder id: {"overall",
    "outlier"}}, "held_out_tasks", "protocol", "metric", "n_queries", "seconds", "reason"}."""
    check_choice_args(tolerance_pp, max_queries, held_out)
    t0 = time.perf_counter()
    tasks = np.asarray(tasks)
    counts = {t: int((tasks == t).sum()) for t in sorted(set(tasks))}
    if len(counts) < 2:
        raise ValueError(f"--encoder auto compares the encoders on held-out tasks: the table has "
                         f"{len(counts)} task(s), at least 2 are needed; pass --encoder static or leave it out")
    rows = sample_rows(tasks, max_queries, seed)
    ts = tasks[rows]
    eligible = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
                if (ts == t).sum() >= MIN_PER_TASK]
    outliers = eligible[:held_out]
    if not outliers or len(set(ts)) < 2:
        raise ValueError(f"--encoder auto: no task has {MIN_PER_TASK} queries to hold out (tasks: {counts})")
    protocol = family(router).protocol
    few_shot = max(1, min(25, min(int((ts == t).sum()) for t in outliers) // 4))
    n_train = int(round(0.6 * min(len(rows) - (ts == t).sum() for t in outliers)))
    spec = family(router).PARAMS  # its sizes (k, n_clusters: bounded by the training queries) fitted to the split
    sizes = {name: max(1, min(int(spec[name].default if v is None else v), n_train))
             for name, v in (("k", k), ("n_clusters", n_clusters)) if name in spec}
    a, c = acc[rows], None if cost is None else cost[rows]
    texts = [prompts[i] for i in rows]
    scores = {}
    for setting in CANDIDATES:
        enc = SentenceEncoder(setting)
        log(f"encoder auto: encoding {len(texts)} queries with {enc.id}")
        X = enc.encode(texts)
        per_task = []
        for t in outliers:
            res = evaluate(X, a, c, ts, router=router, protocol=protocol, outliers=[t], seeds=(seed,),
                           few_shot=few_shot, **sizes)
            per_task.append((res["splits"]["overall"]["prox"], res["splits"]["outlier"]["prox"]))
        scores[enc.id] = {"overall": round(float(np.mean([p[0] for p in per_task])), 3),
                          "outlier": round(float(np.mean([p[1] for p in per_task])), 3),
                          "per_task": {t: round(float(p[0]), 3) for t, p in zip(outliers, per_task)}}
        metric = res["metric"]
    measured = {"scores": scores, "held_out_tasks": outliers, "protocol": protocol, "router": router,
                "metric": metric, "n_queries": int(len(rows)), "seed": int(seed),
                "seconds": round(time.perf_counter() - t0, 1)}
    return decide(measured, tolerance_pp)


def decide(measured: dict, tolerance_pp: float) -> dict:
    """The rule on measured scores: static when its mean overall score is at most ``tolerance_pp`` below MiniLM's."""
    static_id, default_id = encoder_id(STATIC), encoder_id(None)
    gap = measured["scores"][static_id]["overall"] - measured["scores"][default_id]["overall"]
    keep_static = gap >= -float(tolerance_pp)
    chosen = STATIC if keep_static else None
    reason = (f"static {'within' if keep_static else 'more than'} {tolerance_pp:g} pp of MiniLM on mean overall "
              f"{'AUC' if measured['metric'] == 'auc' else 'accuracy'} ({gap:+.2f} pp)")
    return {**measured, "chosen": chosen, "chosen_id": encoder_id(chosen), "tolerance_pp": float(tolerance_pp),
            "gap_pp": round(float(gap), 3), "reason": reason}


def format_choice(choice: dict) -> str:
    lines = [f"encoder auto: {choice['chosen_id']} — {choice['reason']}",
             f"  {choice['router']} / {choice['protocol']}, {choice['n_queries']} queries, held out: "
             f"{', '.join(choice['held_out_tasks'])}, {choice['seconds']:.0f} s"]
    for eid, s in choice["scores"].items():
        lines.append(f"  {eid}: overall {s['overall']:.2f}, outlier {s['outlier']:.2f}")
    return "\n".join(lines)
