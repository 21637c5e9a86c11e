"""The drift monitor's decisions: which routed queries drifted, what to evaluate, when, and what to do
with the labels (paper §4, "Outlier gaps and Router Retraining").

Two signals, both on the served router's own terms:

* **outlier score** — every routed query's distance to the router's reference set (reported by the
  ingress); over the threshold = drifted. The threshold is the router's own, saved in its artifact (what
  ``explain`` shows): a quantile of its ``training_outlier_scores`` on its training queries (each left out of
  the reference), so it is the same distance, computed the same way, as the one it is compared with.
* **true J_z** — a ``shadow_rate`` fraction of routed traffic is evaluated on the whole pool (judge
  graded). For each traffic group (nearest cluster of the training embeddings × inlier/outlier), the
  top-z models by *observed* objective acc − λ·cost are compared with each training task's top-z
  (Jaccard), averaged over the training tasks as in the paper. A group whose J_z falls below the
  threshold has its recent queries re-evaluated, beside the drifted ones.

Re-evaluation: ``min_batch`` queries at a time, through the evaluation job with the judge, within the
hourly limit and the USD budget (an estimate is reserved at submission; the job's real generation +
judge cost is charged when it ends). The job's submission id is derived from its content and recorded
before submitting: a restarted monitor submits the same id again and the Jobs API refuses a duplicate.
A finished job's labels are added to the router (``add_queries``), a new artifact version is written,
and the serving replicas switch to it. A model added to the pool (in the job template) is evaluated on
the router's training queries and added as a column (``add_model``).

``DriftMonitor`` composes the parts and makes these decisions: ``DriftDetector`` (groups, outlier threshold),
``OverlapTracker`` (true J_z), ``TrafficBook`` (window, queues, counters), ``Evaluations`` (jobs and their cost),
``RouterPublisher`` (router versions), ``Scheduler`` (the clock) and the state store (snapshot + journal).
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from proxray.common.hashing import unit_hash
from proxray.common.storage import join
from proxray.monitor.absorb import CANARY, Absorber
from proxray.monitor.candidates import Candidates
from proxray.monitor.config import MonitorConfig
from proxray.monitor.detector import DriftDetector, text_key
from proxray.monitor.evaluations import Evaluations
from proxray.monitor.feedback import ANONYMOUS, FeedbackBook, FeedbackLabels
from proxray.monitor.gate import TrainingSample
from proxray.monitor.jobs import InlineRunner, JobsApiRunner
from proxray.monitor.overlap import OverlapTracker
from proxray.monitor.publisher import RouterPublisher
from proxray.monitor.planner import Planner
from proxray.monitor.scheduler import Scheduler
from proxray.monitor.sources import JUDGE, LabelSources
from proxray.monitor.state import Decisions, Journal
from proxray.monitor.traffic import TrafficBook
from proxray.monitor.views import prometheus_text, status_of

logger = logging.getLogger("proxray.monitor")
__all__ = ["DriftMonitor", "text_key"]


class DriftMonitor:
    """One monitor: ``MonitorConfig`` (or a dict of it); ``encoder`` injected by tests; ``start=True``
    runs the scheduler thread (what the actor does). Tests may call ``tick()`` instead."""

    def __init__(self, config, encoder=None, start: bool = False, runner=None):
        from proxray.data.table import RoutingTable
        from proxray.embeddings.encoder import SentenceEncoder

        self.config = cfg = config if isinstance(config, MonitorConfig) else MonitorConfig.model_validate(config)
        self.state_dir = cfg.state_dir  # a local folder or a URI (an object store every node reads)
        self.publisher = RouterPublisher(cfg.router, join(self.state_dir, "routers"))
        # the encoder the router was fitted with (MiniLM, the static encoder, …): the monitor's embeddings are its
        self.encoder = encoder or SentenceEncoder(getattr(self.publisher.router, "encoder_id_", None), progress=False)
        if cfg.table == "embedded":
            from proxray.pool.simulated import make_table

            table = make_table()
        else:
            table = RoutingTable.read(cfg.table)
        self.decisions = Decisions(table.prompts)
        X = self.encoder.encode(self.decisions.train_prompts)
        acc, cost = table.matrices(models=self.publisher.models)
        cost = np.zeros_like(acc) if cost is None else cost
        self.detector = DriftDetector(self.publisher.router, X, cfg.n_groups)
        self.overlap = OverlapTracker(acc, cost, table.tasks, cfg.lam, cfg.z, cfg.min_group, cfg.overlap_threshold,
                                      max_observed=20 * cfg.window)
        self.book = TrafficBook(cfg.window, cfg.max_buffer)
        self.feedback_book = FeedbackBook(cfg.max_buffer)
        per_query = float(np.mean(cost.sum(1))) if cost.size else 1e-3
        runner = runner or (InlineRunner() if cfg.submit == "inline" else JobsApiRunner(cfg.jobs_address))
        self.evaluations = Evaluations(cfg.name, join(self.state_dir, "evaluations"), runner, cfg.cost_budget,
                                       cfg.est_cost_per_query or 2.0 * max(per_query, 1e-9),  # pool + a judge per answer
                                       self._snapshot)
        self.labels = FeedbackLabels(self.feedback_book, self.book, self.evaluations, join(self.state_dir, "feedback"))
        self.lock = threading.RLock()
        self.scheduler = Scheduler(self.tick, cfg.tick_s)
        self.sample = TrainingSample(X, acc, cost, cfg.gate.train_sample)
        self.sources = LabelSources(cfg.gate, self.sample.rows, self.sample.acc)
        self.feedback_book.refuses = self.sources.set_aside
        self.candidates = Candidates(cfg.gate, cfg.lam, self.detector.threshold)
        self.absorber = Absorber(cfg, self.encoder, self.book, self.overlap, self.evaluations, self.labels,
                                 self.publisher, self.decisions, self.sources, self.candidates, self.sample)
        self.planner = Planner(cfg, self.book, self.evaluations, self.publisher, self.decisions, self.sources,
                               self.candidates, self.labels, self.encoder, self.absorber, self._snapshot)
        self.journal = Journal(self.state_dir, (self.book, self.overlap, self.evaluations, self.publisher,
                                                self.feedback_book, self.decisions, self.sources, self.candidates),
                               self._apply)
        self.journal.restore()
        if start:
            self.start()

    # ---- traffic ---------------------------------------------------------------------------------
    def report(self, prompt: str, embedding, outlier_score: float) -> bool:
        """One routed query (the ingress calls this fire-and-forget): its text, its embedding (d,) and the served
        router's outlier score for it. Returns whether it drifted."""
        group, drifted = self.detector.group(embedding), self.detector.drifted(outlier_score)
        key = text_key(prompt)
        with self.lock:
            entry = {"seq": self.book.seq + 1, "t": time.time(), "key": key, "prompt": prompt, "group": group,
                     "drifted": drifted, "score": float(outlier_score),
                     "shadow": bool(unit_hash(key, "shadow") < self.config.shadow_rate)}
            self.journal.record(entry)
            try:  # a candidate in its window, routed beside the served router
                self.candidates.shadow(self.publisher.router, embedding)
            except Exception:  # noqa: BLE001 - a shadow that fails must not lose the report
                logger.exception("proxray monitor: shadowing the candidate failed")
        return drifted

    def feedback(self, prompt: str, model: str, score: float, cost: float | None = None, comment: str | None = None,
                 source: str | None = None):
        """A user's score in [0, 1] of ``model``'s answer to ``prompt`` (the ingress calls this fire-and-forget):
        that model's label for that query (proxray.monitor.feedback); ``source``: the key that sent it."""
        with self.lock:
            self.journal.record({"seq": self.book.seq + 1, "t": time.time(), "kind": "feedback", "key": text_key(prompt),
                                 "prompt": prompt, "model": str(model), "score": float(np.clip(score, 0.0, 1.0)),
                                 "cost": None if cost is None else float(cost), "comment": comment,
                                 "source": str(source or ANONYMOUS), "version": self.publisher.served})

    def _apply(self, e: dict) -> None:
        """One journal entry's effect (a routed query's report, or feedback), live and on replay."""
        if e.get("kind") == "feedback":
            self.book.seq = e["seq"]
            self.feedback_book.apply(e)
            self.candidates.observe(e.get("version", 0), e["score"])
        else:
            self.book.apply(e)

    def overlap_of(self, prompts) -> dict:
        """J_z of the shadow-labelled queries among ``prompts`` (a measurement for operators and the demo:
        "how does this traffic's observed model ranking compare with the training tasks'")."""
        return self.overlap.of({text_key(p) for p in prompts})

    # ---- scheduler -------------------------------------------------------------------------------
    def start(self) -> None:
        """Run ``tick`` every ``tick_s`` in a background thread until ``stop``."""
        self.scheduler.start()

    def stop(self) -> None:
        self.scheduler.stop()
        with self.lock:
            self._snapshot()

    def tick(self, now: float | None = None) -> None:
        """One round: settle submissions and running jobs, apply the J_z trigger, start what is due."""
        now = time.time() if now is None else now
        with self.lock:
            self.evaluations.submit_pending(now)
            self._overlap_trigger()
            self.planner.plan(now)
            self.absorber.settle(now)
            self.absorber.watch()
            for e, outcome in list(self.evaluations.outcomes(now, self.config.job_timeout_s)):
                if outcome == "SUCCEEDED" and e["kind"] != "shadow" and self.candidates.current is not None:
                    continue  # one candidate at a time: its labels wait for the one in its window
                if outcome == "SUCCEEDED":
                    try:
                        self.absorber.finish(e)
                        self._snapshot()
                        continue
                    except Exception as err:  # noqa: BLE001 - a bad result must not stop the monitor
                        logger.exception("proxray monitor: absorbing %s failed", e["id"])
                        outcome = f"absorbing failed: {err}"
                self.absorber.fail(e, now, outcome)
                self._snapshot()
            if self.journal.dirty:
                self._snapshot()

    def _overlap_trigger(self) -> None:
        for g, o in self.overlap.by_group().items():
            if o["j"] < self.overlap.threshold and self.decisions.triggered.get(g) != self.publisher.version:
                self.decisions.triggered[g] = self.publisher.version
                self.book.event("overlap_trigger", group=g, j=o["j"], queued=self.book.queue_group(g))
                self.journal.touch()

    # ---- state ---------------------------------------------------------------------------------
    @property
    def train_prompts(self) -> list:
        return self.decisions.train_prompts

    @property
    def blocked(self) -> str | None:
        return self.planner.blocked

    @property
    def not_before(self) -> float:
        return self.decisions.not_before

    def checkpoint(self) -> dict:
        """The snapshot: each part's own ``state()`` (traffic book, J_z tracker, evaluations, router publisher,
        feedback, the monitor's decisions)."""
        return self.journal.checkpoint()

    def _snapshot(self) -> None:
        self.journal.snapshot()

    def versions(self) -> list:
        """Every router version: its number, path, status (served, replaced, rolled_back), when and why made."""
        with self.lock:
            return [dict(v) for v in self.publisher.versions]

    def rollback(self, to: int | None = None) -> dict:
        """Serve an earlier version again (``Absorber.rollback``); the replicas switch to it between requests; a
        candidate in its window is rejected."""
        with self.lock:
            moved = self.absorber.rollback(to)
            self._snapshot()
            return moved

    # ---- views -----------------------------------------------------------------------------------
    def current_router(self) -> str:
        return self.publisher.path

    def status(self) -> dict:
        with self.lock:
            return status_of(self)

    def prometheus(self) -> str:
        return prometheus_text(self.status())
