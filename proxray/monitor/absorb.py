"""What an ended evaluation does to the monitor's state: a succeeded one's labels become new model columns (growth),
observed J_z (shadow), new training queries of the router (drift), or a spot check of a feedback batch (spot) — the
last two after their label sources were checked; every router they make is a *candidate* that passes the gate
(``proxray.monitor.gate``) and its shadow window (``proxray.monitor.candidates``) before it serves, or is kept
rejected with its figures. A failed evaluation is charged what it evaluated and its drift queries go back to the
front of the queue."""
from __future__ import annotations

import logging

import numpy as np

from proxray.common.storage import join
from proxray.monitor import gate
from proxray.monitor.sources import JUDGE

logger = logging.getLogger("proxray.monitor")
CANARY = "canary-"


class Absorber:
    def __init__(self, config, encoder, book, overlap, evaluations, labels, publisher, decisions, sources, candidates,
                 sample):
        self.config, self.encoder, self.book, self.overlap = config, encoder, book, overlap
        self.evaluations, self.labels, self.publisher, self.decisions = evaluations, labels, publisher, decisions
        self.sources, self.candidates, self.sample = sources, candidates, sample

    def fail(self, e: dict, now: float, why: str) -> None:
        """Charge what it evaluated and mark it failed; a drift evaluation's queries go back to the front of the queue,
        retried after ``retry_after_s``; a feedback batch whose spot check failed is kept rejected."""
        self.evaluations.fail(e, why)
        keys = [k for k in e["meta"] if not k.startswith(CANARY)]
        if e["kind"] == "drift":  # its queries go back to the front of the queue (and out of seen), retried later
            prompts = self.evaluations.prompts(e)
            self.book.give_back(keys, {k: {"prompt": prompts[k], "group": e["meta"][k]["group"], "reason": "retry"}
                                       for k in keys})
            self.decisions.not_before = now + self.config.retry_after_s
        elif e["kind"] == "spot":
            self._feedback_candidate(e["feedback"]["id"], f"its spot check failed: {why}")
        else:
            self.book.seen.difference_update(keys)
        self.book.event("failed", id=e["id"], why=why)

    def finish(self, e: dict) -> None:
        """A succeeded evaluation's labels: new model columns (growth), observed J_z (shadow), new training queries
        (drift) or the spot check of a feedback batch (spot); the router they make is offered to the gate."""
        from proxray.data.table import RoutingTable
        from proxray.evaljob import graded_parts

        parts = graded_parts(e["out"])
        self.evaluations.charge(e, parts)
        if e["kind"] == "growth":  # each new model a column over the training queries, in the router's order
            ids = [f"train-{i}" for i in range(len(self.decisions.train_prompts))]
            router = self.publisher.with_models(parts, ids, e["models"])
            s = self.sample
            figures = {"lam": self.config.lam, "train": gate.on_training(
                self.publisher.router, router, s.X, s.rows, *s.with_models(parts, e["models"]), self.config.lam)}
            self.offer(router, figures, {}, added_models=e["models"])
            e["status"] = "DONE"
            return
        table = RoutingTable.read(join(e["out"], "routing_table.parquet"))
        models = self.publisher.models
        missing = [m for m in models if m not in table.models]
        if missing:
            raise ValueError(f"the evaluation lacks the router's models {missing}")
        judged = self._canaries(e, table, models)
        table = table.subset([q for q in table.query_ids if not q.startswith(CANARY)])
        acc, cost = table.matrices(models=models)
        cost = np.zeros_like(acc) if cost is None else cost
        if e["kind"] == "shadow":
            for i, k in enumerate(table.query_ids):
                self.overlap.observe(k, e["meta"][k], acc[i], cost[i])
        elif e["kind"] == "spot":  # a feedback batch's sample, graded by the judge: its sources checked
            cells = {(q, m): acc[table.query_ids.index(q), m] for q, m, _, _ in e["feedback"]["cells"]
                     if q in table.query_ids}
            checked = self.sources.check_feedback([(src, score, cells[(q, m)]) for q, m, src, score
                                                   in e["feedback"]["cells"] if (q, m) in cells])
            self._feedback_candidate(e["feedback"]["id"], None, judge=judged, checked=checked)
        else:  # drift: the labelled queries added to the router (no refit); a training "task" for J_z once served
            pairs = self.labels.merge(e, table, models, acc, cost)
            checked = self.sources.check_feedback(pairs) if pairs else {}
            X = self.encoder.encode(table.prompts)
            refuse = None if self.sources.trusted(JUDGE) else self._untrusted(JUDGE)
            self._offer_queries(X, acc, cost, list(table.query_ids), list(table.prompts), list(table.tasks), refuse,
                                {"judge": judged, "feedback": checked}, task=e["id"], absorbed=e["id"],
                                n=len(table.prompts))
        e["status"] = "DONE"

    # ---- label sources ------------------------------------------------------------------------------------------
    def _canaries(self, e: dict, table, models) -> dict:
        """The judge's verdicts on the evaluation's canaries against their table labels."""
        cells = [(k, m, side) for k, meta in e["meta"].items() if k.startswith(CANARY) for m, side in meta["canary"]]
        if not cells:
            return {}
        sub = table.subset([k for k, _, _ in cells])
        acc, _ = sub.matrices(models=models)
        labels = {(q, m): acc[i, m] for i, q in enumerate(sub.query_ids) for m in range(len(models))}
        return self.sources.check_judge(cells, labels)

    def _untrusted(self, source: str) -> str:
        a = self.sources.agreement(source)
        what = "the judge" if source == JUDGE else f"feedback from {source!r}"
        return (f"{what} agreed {a:.2f} with its spot checks ({self.sources.of(source)['checked']} cells), under the "
                f"floor {self.config.gate.trust_floor}" if a is not None else f"{what} has not been spot-checked")

    def _feedback_candidate(self, fid: str, refuse: str | None, **checks) -> None:
        """A feedback batch (its labels as written, ``feedback/<fid>``) offered, or kept rejected where its spot check
        failed or a source of it is not trusted."""
        from proxray.data.table import RoutingTable

        table = RoutingTable.read(join(join(self.labels.folder, fid), "routing_table.parquet"))
        acc, cost = table.matrices(models=self.publisher.models)
        sources = sorted({g.split(":", 1)[1] for g in table.df["grader"] if str(g).startswith("feedback:")})
        for s in [JUDGE] + sources:
            if refuse is None and not self.sources.trusted(s):
                refuse = self._untrusted(s)
        self._offer_queries(self.encoder.encode(table.prompts), acc, np.zeros_like(acc) if cost is None else cost,
                            list(table.query_ids), list(table.prompts), ["feedback"] * table.n_queries, refuse, checks,
                            feedback=fid, n=table.n_queries)

    # ---- candidates ---------------------------------------------------------------------------------------------
    def _offer_queries(self, X, acc, cost, keys, prompts, tasks, refuse, checks, task=None, **why) -> None:
        publisher, spec = self.publisher, self.config.gate
        router = publisher.with_queries(X, acc, cost, query_ids=self.decisions.public_ids(keys), tasks=tasks)
        s = self.sample
        figures = {"lam": self.config.lam, "sources": checks,
                   "train": gate.on_training(publisher.router, router, s.X, s.rows, s.acc, s.cost, self.config.lam),
                   "new": gate.held_out(publisher.router, lambda mask: publisher.with_queries(
                       X[mask], acc[mask], cost[mask]), X, acc, cost, self.config.lam, spec.folds)}
        effects = {"prompts": prompts, "task": task, "top_z": self.overlap.top_of(acc, cost) if task else None}
        self.offer(router, figures, effects, refuse=refuse, **why)

    def offer(self, router, figures: dict, effects: dict, refuse: str | None = None, **why) -> None:
        """The gate: rejected (kept with its figures and why), or a candidate in its shadow window (served at once
        where the gate is off or the window is empty)."""
        if not self.config.gate.enabled:
            self.publish(router, effects, **why)
            return
        ok, reason = (False, refuse) if refuse else gate.decide(figures, self.config.gate)
        if not ok:
            v, _ = self.publisher.save(router, "rejected", **why, gate={"figures": figures, "why": reason})
            self.candidates.close(v, False, reason, figures)
            self.book.event("rejected", version=v, why=reason, **why)
            logger.warning("proxray monitor: router version %d rejected: %s", v, reason)
            return
        v, path = self.publisher.save(router, "candidate", **why, gate={"figures": figures, "why": reason})
        self.candidates.open(v, path, router, figures, effects)
        self.book.event("candidate", version=v, why=reason, **why)
        if self.config.gate.window_requests == 0 or self.config.gate.window_s == 0:
            self.settle(float("inf"))

    def settle(self, now: float) -> None:
        """The candidate whose shadow window closed: promoted (its effects applied) or rejected."""
        c = self.candidates
        if not c.window_closed(now):
            return
        ok, reason, shadow = c.verdict()
        v, figures = c.current["version"], {**c.current["figures"], "shadow": shadow}
        if ok:
            effects, router = c.current["effects"], c.router
            self.publisher.promote(v, router, shadow=shadow, why=reason)
            self._apply(effects)
            self.book.event("router", version=v, path=self.publisher.path, **self.publisher.get(v)["why"])
        else:
            self.publisher.reject(v, shadow=shadow, why=reason)
            self.book.event("rejected", version=v, why=reason)
            logger.warning("proxray monitor: router version %d rejected after its shadow window: %s", v, reason)
        c.close(v, ok, reason, figures)

    def _apply(self, effects: dict) -> None:
        self.decisions.train_prompts.extend(effects.get("prompts") or [])
        if effects.get("top_z") is not None:
            self.overlap.task_sets[effects["task"]] = effects["top_z"]

    def watch(self) -> None:
        """Roll the served version back by itself where its live feedback fell under its predecessor's."""
        v = self.publisher.get(self.publisher.served)
        parent = v.get("parent")
        if "gate" not in v or parent is None:
            return
        why = self.candidates.fallen(v["version"], parent)
        if why:
            self.rollback(parent, why=why)

    def rollback(self, to: int | None = None, why: str = "asked") -> dict:
        """Serve version ``to`` again (``RouterPublisher.rollback``). The training queries the monitor tracks follow
        the served router: those only the rolled-back versions held are no longer its own (nor evaluated again). A
        candidate in its window is rejected: it grew from the version that stops serving."""
        moved = self.publisher.rollback(to)
        self.publisher.get(moved["from"])["rolled_back"] = why
        del self.decisions.train_prompts[max(self.publisher.router.n_train_, self.decisions.n_table):]
        if self.candidates.current is not None:
            v = self.candidates.current["version"]
            self.publisher.reject(v, why="the version it grew from was rolled back")
            self.candidates.close(v, False, "the version it grew from was rolled back", {})
        self.book.event("rollback", why=why, **{k: moved[k] for k in ("from", "to")})
        logger.warning("proxray monitor: router version %d rolled back (%s); serving version %d", moved["from"], why,
                       moved["to"])
        return moved

    def publish(self, router, effects: dict | None = None, **event) -> None:
        path = self.publisher.publish(router, **event)
        self._apply(effects or {})
        self.book.event("router", version=self.publisher.version, path=path, **event)
