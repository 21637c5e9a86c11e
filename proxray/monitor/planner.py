"""What the monitor evaluates next, and when: a batch of drifted queries (with the judge's canaries), a shadow sample,
a model added to the pool (growth), a feedback batch's spot check — each within the hourly limit and the budget, and
the reason it waits when it cannot (``blocked``, for status)."""
from __future__ import annotations

from proxray.common.hashing import unit_hash
from proxray.monitor.absorb import CANARY
from proxray.monitor.sources import JUDGE


class Planner:
    def __init__(self, cfg, book, evaluations, publisher, decisions, sources, candidates, labels, encoder, absorber,
                 snapshot):
        self.cfg, self.book, self.evaluations, self.publisher = cfg, book, evaluations, publisher
        self.decisions, self.sources, self.candidates, self.labels = decisions, sources, candidates, labels
        self.encoder, self.absorber, self.snapshot = encoder, absorber, snapshot
        self.blocked = None  # why nothing was submitted last time (budget, growth, judge set aside), for status

    def plan(self, now: float) -> None:
        self.grow(now)
        self.evaluate("drift", now)
        self.evaluate("shadow", now)
        self.feedback(now)

    def evaluate(self, kind: str, now: float) -> None:
        """A drift batch (``min_batch`` queued) or a shadow sample, within the hourly limit and the budget."""
        cfg, book = self.cfg, self.book
        queue, size = (book.drift_queue, cfg.min_batch) if kind == "drift" else (book.shadow_queue, cfg.shadow_batch)
        if self.evaluations.running(kind) or not queue:
            return
        if len(queue) < size:  # a shadow batch also goes out when its oldest query has waited long enough
            oldest = next(iter(queue.values())).get("t", now)
            if kind == "drift" or now - oldest < cfg.shadow_max_wait_s:
                return
            size = len(queue)
        if kind == "drift" and (now < self.decisions.not_before or
                                self.evaluations.started_within("drift", now, 3600) >= cfg.max_evals_per_hour):
            return
        if kind == "drift" and cfg.gate.enabled and self.sources.set_aside(JUDGE):
            self.blocked = "judge set aside"  # its labels would be refused: nothing more is spent on it
            return
        reserve = size * self.evaluations.est_cost
        if not self.evaluations.affordable(reserve):
            self.blocked = "budget"
            return
        keys, items = book.take(kind, size)
        self.blocked = None
        rows = [{"query_id": k, "task": it["group"], "prompt": it["prompt"]} for k, it in zip(keys, items)]
        meta = {k: {"group": it["group"], "outlier": bool(it.get("outlier", it["group"].endswith("*")))}
                for k, it in zip(keys, items)}
        self.record(kind, rows, meta, reserve, now, canaries=kind == "drift")

    def record(self, kind: str, rows: list, meta: dict, reserve: float, now: float, models=None,
               canaries: bool = False, extra: dict | None = None) -> None:
        """Record and submit an evaluation (``Evaluations.record``); ``canaries``: the judge's spot checks ride along."""
        if canaries and self.cfg.gate.enabled:  # proxray.monitor.sources
            prompts = self.decisions.train_prompts
            for row, cells in self.sources.canaries(f"{kind}-{len(self.evaluations.items)}"):
                rows.append({"query_id": f"{CANARY}{row}", "task": "canary", "prompt": prompts[row]})
                meta[f"{CANARY}{row}"] = {"group": "canary", "outlier": False, "canary": cells}
        e = self.evaluations.record(kind, rows, meta, reserve, now, self.cfg.job, models, extra)
        self.book.event("submitted", id=e["id"], kind=kind, n=len(rows))

    # ---- feedback: users' scores on their own (beside the judge's: Absorber.finish) --------------------------
    def feedback(self, now: float) -> None:
        """A feedback batch due: spot-checked by the judge first (a ``spot`` evaluation), then offered to the gate."""
        gated = self.cfg.gate.enabled
        if gated and (self.candidates.current is not None or self.evaluations.running("spot")):
            return  # one batch at a time: the one in its spot check or shadow window first
        self.labels.book.drop_refused()
        got = self.labels.batch(now, self.cfg, self.publisher, self.encoder)
        if got is None:
            return
        fid, keys, prompts, X, acc, cost, items = got
        if not gated:
            router = self.publisher.with_queries(X, acc, cost, query_ids=self.decisions.public_ids(keys),
                                                 tasks=["feedback"] * len(keys))
            self.absorber.publish(router, {"prompts": prompts}, feedback=fid, n=len(keys))
        else:  # a sample graded by the judge before the batch may train the router
            models = self.publisher.models
            pick = sorted(range(len(keys)), key=lambda i: unit_hash(fid, keys[i]))[: self.cfg.gate.spot_checks]
            rows = [{"query_id": keys[i], "task": "spot", "prompt": prompts[i]} for i in pick]
            cells = [(keys[i], models.index(m), lab["source"], lab["score"]) for i in pick
                     for m, lab in items[i]["labels"].items() if m in models]
            self.record("spot", rows, {r["query_id"]: {"group": "spot", "outlier": False} for r in rows},
                        (len(rows) + 4) * self.evaluations.est_cost, now, canaries=True,
                        extra={"feedback": {"id": fid, "cells": cells}})
        self.snapshot()

    # ---- growth: a model added to the pool (the job template) is evaluated on the training queries --------
    def grow(self, now: float) -> None:
        pool, ev, n_router = [m.id for m in self.cfg.job.models], self.evaluations, self.publisher.router.n_train_
        new, prompts = [m for m in pool if m not in self.publisher.models], self.decisions.train_prompts
        if new and n_router != len(prompts):  # add_model needs the training queries in the router's order
            if self.blocked != "growth":
                self.book.event("growth_refused", why=f"the router has {n_router} training queries, the table and "
                                f"absorbed evaluations {len(prompts)}: refit it on the table")
            self.blocked = "growth"
            return
        if not new or ev.running("growth") or ev.failed_within("growth", now, self.cfg.retry_after_s):
            return
        rows = [{"query_id": f"train-{i}", "task": "training", "prompt": p} for i, p in enumerate(prompts)]
        reserve = len(rows) * ev.est_cost * len(new) / max(len(pool), 1)
        if not ev.affordable(reserve):
            self.blocked = "budget"
            return
        self.record("growth", rows, {r["query_id"]: {"group": "training", "outlier": False} for r in rows},
                    reserve, now, models=new)
