"""The drift monitor's decisions: which routed queries drifted, what to evaluate, when, and what to do
with the labels (paper §4, "Outlier gaps and Router Retraining").

Two signals, both on the served router's own terms:

* **outlier score** — every routed query's distance to the router's reference set (reported by the
  ingress); over the threshold = drifted. The threshold is the ``quantile`` of the router's own
  ``training_outlier_scores`` on its training queries (each left out of the reference), so it is the
  same distance, computed the same way, as the one it is compared with.
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
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path

import numpy as np

from proxray.pool.engines import _unit
from proxray.experiments.metrics import jaccard, top_z
from proxray.routing.objective import objective
from proxray.monitor.config import MonitorConfig
from proxray.monitor.jobs import InlineRunner, JobsApiRunner
from proxray.monitor.state import StateStore

logger = logging.getLogger("proxray.monitor")


def text_key(prompt: str) -> str:
    """A query's identity in the monitor: the hash of its text (retries and repeats count once)."""
    return hashlib.sha256(str(prompt).encode()).hexdigest()[:20]


class DriftMonitor:
    """One monitor: ``MonitorConfig`` (or a dict of it); ``encoder`` injected by tests; ``start=True``
    runs the scheduler thread (what the actor does). Tests may call ``tick()`` instead."""

    def __init__(self, config, encoder=None, start: bool = False, runner=None):
        from sklearn.cluster import KMeans

        from proxray.routing.registry import load_router
        from proxray.embeddings.encoder import SentenceEncoder
        from proxray.routing.index import normalize
        from proxray.data.table import RoutingTable

        self.config = cfg = config if isinstance(config, MonitorConfig) else MonitorConfig.model_validate(config)
        self.state_dir = Path(cfg.state_dir)
        self.store = StateStore(self.state_dir)
        self.runner = runner or (InlineRunner() if cfg.submit == "inline" else JobsApiRunner(cfg.jobs_address))
        self.encoder = encoder or SentenceEncoder(progress=False)
        self.router_path = cfg.router
        self.router = load_router(cfg.router)
        if cfg.table == "embedded":
            from proxray.data.synthetic import make_table

            table = make_table()
        else:
            table = RoutingTable.read(cfg.table)
        self.train_prompts = list(table.prompts)
        X = self.encoder.encode(self.train_prompts)
        acc, cost = table.matrices(models=self.router.models_)
        cost = np.zeros_like(acc) if cost is None else cost
        # training tasks' top-z sets S_z(t, λ), from observed objectives
        self.task_sets = {str(t): sorted(top_z(objective(acc, cost, cfg.lam)[table.tasks == t].mean(0), cfg.z))
                          for t in sorted(set(table.tasks))}
        self.models = list(self.router.models_)
        # traffic groups: clusters of the training embeddings
        Xn = normalize(np.asarray(X, dtype=np.float32))
        self.centers = normalize(KMeans(n_clusters=min(cfg.n_groups, len(Xn)), random_state=0, n_init=1)
                                 .fit(Xn).cluster_centers_.astype(np.float32))
        # the outlier threshold from the router's own score on its own training queries
        self.outlier_threshold = float(np.quantile(self.router.training_outlier_scores(X), cfg.quantile))
        self.overlap_threshold = self._auto_overlap() if cfg.overlap_threshold == "auto" else float(cfg.overlap_threshold)
        per_query = float(np.mean(cost.sum(1))) if cost.size else 1e-3
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = None
        # ---- state (checkpointed) ----
        self.seq = 0
        self.window = deque(maxlen=cfg.window)
        self.drift_queue: OrderedDict = OrderedDict()  # key -> {"prompt", "group", "reason"}
        self.shadow_queue: OrderedDict = OrderedDict()  # key -> {"prompt", "group", "outlier"}
        self.seen: set = set()  # keys re-evaluated (or in flight): never queued twice
        self.shadow_seen: set = set()  # keys shadow-evaluated (or in flight)
        self.blocked = None  # why nothing was submitted last time (budget), for status
        self.shadow_obs: OrderedDict = OrderedDict()  # key -> {"group", "outlier", "objective": [M]}
        self.evaluations: list = []
        self.spent = 0.0  # USD charged (finished jobs) + reserved (running ones)
        self.est_cost = cfg.est_cost_per_query or 2.0 * max(per_query, 1e-9)  # pool + a judge reading every answer
        self.version = 0
        self.triggered: dict = {}  # group -> router version when its J_z last triggered
        self.not_before = 0.0  # no drift evaluation before (after a failure)
        self.stats = {"reported": 0, "drifted": 0, "shadowed": 0, "dropped_full": 0, "repeats": 0}
        self.events: list = []  # first detection, submissions, absorptions (bounded)
        self._dirty = 0
        self._restore()
        if start:
            self.start()

    # ---- thresholds ------------------------------------------------------------------------------
    def _auto_overlap(self) -> float:
        """Half the mean J_z of the training tasks against each other: a group that shares less than half as
        much of its top-z with the training tasks as they share among themselves is new territory."""
        sets = {t: frozenset(s) for t, s in self.task_sets.items()}
        if len(sets) < 2:
            return 0.0
        own = [np.mean([jaccard(s, o) for u, o in sets.items() if u != t]) for t, s in sets.items()]
        return float(0.5 * np.mean(own))

    # ---- traffic ---------------------------------------------------------------------------------
    def report(self, query_id, prompt: str, embedding, utility, chosen: int, outlier_score: float) -> bool:
        """One routed query (the ingress calls this fire-and-forget): its embedding (d,), the router's
        estimated objective per model, its outlier score. Returns whether it drifted."""
        e = np.asarray(embedding, dtype=np.float32)
        group = int(np.argmax(self.centers @ (e / max(float(np.linalg.norm(e)), 1e-12))))
        key = text_key(prompt)
        drifted = bool(outlier_score > self.outlier_threshold)
        with self.lock:
            self.seq += 1
            entry = {"seq": self.seq, "t": time.time(), "key": key, "prompt": prompt, "group": group,
                     "drifted": drifted, "score": float(outlier_score),
                     "shadow": bool(_unit(key, "shadow") < self.config.shadow_rate)}
            self._apply(entry)
            self.store.append(entry)
            self._dirty += 1
        return drifted

    def _group_name(self, group: int, drifted: bool) -> str:
        return f"c{group}" + ("*" if drifted else "")

    def _apply(self, e: dict) -> None:
        """A report's effect on the state (also how the journal is replayed)."""
        cfg = self.config
        self.stats["reported"] += 1
        name = self._group_name(e["group"], e["drifted"])
        self.window.append({"key": e["key"], "prompt": e["prompt"], "group": name, "drifted": e["drifted"],
                            "score": e["score"]})
        if e["drifted"]:
            self.stats["drifted"] += 1
            if not any(ev["event"] == "first_drift" for ev in self.events):
                self._event("first_drift", reported=self.stats["reported"])
            self._enqueue(self.drift_queue, e["key"], {"prompt": e["prompt"], "group": name, "reason": "outlier"})
        if e["shadow"] and e["key"] not in self.shadow_seen and e["key"] not in self.shadow_queue:
            if len(self.shadow_queue) < cfg.max_buffer:
                self.shadow_queue[e["key"]] = {"prompt": e["prompt"], "group": name, "outlier": e["drifted"], "t": e["t"]}
                self.stats["shadowed"] += 1
            else:
                self.stats["dropped_full"] += 1

    def _enqueue(self, queue, key, item) -> None:
        if key in queue or key in self.seen:
            self.stats["repeats"] += 1
        elif len(queue) >= self.config.max_buffer:
            self.stats["dropped_full"] += 1
        else:
            queue[key] = item

    def _event(self, event: str, **kw) -> None:
        self.events.append({"event": event, "time": time.time(), **kw})
        del self.events[:-50]

    # ---- J_z -------------------------------------------------------------------------------------
    def _j(self, objectives) -> float:
        s = top_z(np.mean(objectives, 0), self.config.z)
        return float(np.mean([jaccard(s, frozenset(t)) for t in self.task_sets.values()]))

    def group_overlaps(self) -> dict:
        """{group: {"j", "n"}} from the shadow-labelled queries, groups with at least ``min_group``."""
        by = {}
        for o in self.shadow_obs.values():
            by.setdefault(o["group"], []).append(o["objective"])
        return {g: {"j": round(self._j(v), 4), "n": len(v)} for g, v in sorted(by.items())
                if len(v) >= self.config.min_group}

    def overlap_by_kind(self) -> dict:
        """J_z of all shadow-labelled inlier traffic and of all outlier traffic (None below ``min_group``)."""
        out = {}
        for kind, flag in (("inlier", False), ("outlier", True)):
            v = [o["objective"] for o in self.shadow_obs.values() if o["outlier"] == flag]
            out[kind] = {"j": round(self._j(v), 4) if len(v) >= self.config.min_group else None, "n": len(v)}
        return out

    def overlap_of(self, prompts) -> dict:
        """J_z of the shadow-labelled queries among ``prompts`` (a measurement for operators and the demo:
        "how does this traffic's observed model ranking compare with the training tasks'")."""
        keys = {text_key(p) for p in prompts}
        v = [o["objective"] for k, o in self.shadow_obs.items() if k in keys]
        return {"j": round(self._j(v), 4) if v else None, "n": len(v)}

    # ---- scheduler -------------------------------------------------------------------------------
    def start(self) -> None:
        """Run ``tick`` every ``tick_s`` in a background thread until ``stop``."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="proxray-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self.lock:
            self._snapshot()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - one bad tick (Jobs API down) must not end the loop
                logger.exception("proxray monitor: tick failed")
            self._stop.wait(self.config.tick_s)

    def tick(self, now: float | None = None) -> None:
        """One round: settle submissions and running jobs, apply the J_z trigger, start what is due."""
        now = time.time() if now is None else now
        with self.lock:
            for e in [e for e in self.evaluations if e["status"] == "SUBMITTING"]:
                self._submit_recorded(e, now)
            self._overlap_trigger()
            self._maybe_grow(now)
            self._maybe_evaluate("drift", now)
            self._maybe_evaluate("shadow", now)
            for e in [e for e in self.evaluations if e["status"] == "RUNNING"]:
                self._poll(e, now)
            if self._dirty:
                self._snapshot()

    def _overlap_trigger(self) -> None:
        for g, o in self.group_overlaps().items():
            if o["j"] < self.overlap_threshold and self.triggered.get(g) != self.version:
                self.triggered[g] = self.version
                n = 0
                for w in self.window:
                    if w["group"] == g and w["key"] not in self.drift_queue and w["key"] not in self.seen:
                        self._enqueue(self.drift_queue, w["key"], {"prompt": w["prompt"], "group": g, "reason": "overlap"})
                        n += 1
                self._event("overlap_trigger", group=g, j=o["j"], queued=n)
                self._dirty += 1

    def _running(self, kind: str) -> bool:
        return any(e["kind"] == kind and e["status"] in ("SUBMITTING", "RUNNING") for e in self.evaluations)

    def _maybe_evaluate(self, kind: str, now: float) -> str | None:
        cfg = self.config
        queue, size = (self.drift_queue, cfg.min_batch) if kind == "drift" else (self.shadow_queue, cfg.shadow_batch)
        if self._running(kind) or not queue:
            return None
        if len(queue) < size:  # a shadow batch also goes out when its oldest query has waited long enough
            oldest = next(iter(queue.values())).get("t", now)
            if kind == "drift" or now - oldest < cfg.shadow_max_wait_s:
                return None
            size = len(queue)
        if kind == "drift":
            if now < self.not_before:
                return None
            if sum(now - e["time"] < 3600 for e in self.evaluations if e["kind"] == "drift") >= cfg.max_evals_per_hour:
                return None
        reserve = size * self.est_cost
        if self.spent + reserve > cfg.cost_budget:
            self.blocked = "budget"
            return None
        keys = list(queue)[:size]
        items = [queue.pop(k) for k in keys]
        (self.seen if kind == "drift" else self.shadow_seen).update(keys)
        self.blocked = None
        rows = [{"query_id": k, "task": it["group"], "prompt": it["prompt"]} for k, it in zip(keys, items)]
        meta = {k: {"group": it["group"], "outlier": bool(it.get("outlier", it["group"].endswith("*")))}
                for k, it in zip(keys, items)}
        return self._record(kind, rows, meta, reserve, now)

    def _record(self, kind: str, rows: list, meta: dict, reserve: float, now: float, models=None) -> str:
        """Write the evaluation's inputs, record it (with its submission id) durably, then submit it."""
        n = sum(1 for e in self.evaluations if e["kind"] == kind) + 1
        digest = hashlib.sha256(json.dumps([r["query_id"] for r in rows]).encode()).hexdigest()[:8]
        sid = f"{self.config.name}-{kind}-{n:04d}-{digest}"
        folder = self.state_dir / "evaluations" / sid
        folder.mkdir(parents=True, exist_ok=True)
        qpath = folder / "queries.jsonl"
        qpath.write_text("".join(json.dumps(r) + "\n" for r in rows))
        import yaml

        cfg_path = folder / "job.yaml"
        cfg_path.write_text(yaml.safe_dump({**self.config.job, "query_sets": [{"name": kind, "path": str(qpath)}]}))
        e = {"id": sid, "kind": kind, "n": len(rows), "status": "SUBMITTING", "time": now, "submitted": None,
             "reserved": reserve, "charged": None, "config": str(cfg_path), "out": str(folder / "out"),
             "meta": meta, "models": models}
        self.evaluations.append(e)
        self.spent += reserve
        self._snapshot()  # recorded before submitting: a restart finds it and submits the same id
        self._submit_recorded(e, now)
        self._event("submitted", id=sid, kind=kind, n=len(rows))
        return sid

    def _submit_recorded(self, e: dict, now: float) -> None:
        try:
            self.runner.submit(e["id"], e["config"], e["out"], e.get("models"))
        except Exception as err:  # noqa: BLE001 - the Jobs API is down: try again next tick
            logger.warning("proxray monitor: submitting %s failed: %s", e["id"], err)
            return
        e["status"], e["submitted"] = "RUNNING", now
        self._snapshot()

    def _poll(self, e: dict, now: float) -> None:
        status = self.runner.status(e["id"])
        if status == "SUCCEEDED":
            try:
                self._finish(e)
            except Exception as err:  # noqa: BLE001 - a bad result must not stop the monitor
                logger.exception("proxray monitor: absorbing %s failed", e["id"])
                self._fail(e, now, f"absorbing failed: {err}")
        elif status in ("FAILED", "STOPPED", "MISSING"):
            self._fail(e, now, f"job {status.lower()}")
        elif now - (e["submitted"] or e["time"]) > self.config.job_timeout_s:
            self.runner.stop(e["id"])
            self._fail(e, now, f"timed out after {self.config.job_timeout_s:.0f} s")

    def _charge(self, e: dict, rows) -> None:
        actual = float(rows["cost"].fillna(0).sum() + (rows["judge_cost"].fillna(0).sum() if "judge_cost" in rows else 0.0))
        self.spent += actual - e["reserved"]
        e["charged"], e["reserved"] = actual, 0.0
        if e["n"] and actual > 0 and e["kind"] != "growth":
            self.est_cost = 0.5 * self.est_cost + 0.5 * actual / e["n"]

    def _fail(self, e: dict, now: float, why: str) -> None:
        from proxray.evaljob.job import read_parts

        try:
            self._charge(e, read_parts(Path(e["out"]) / "table"))  # what was evaluated before it ended
        except Exception:  # noqa: BLE001 - nothing readable: nothing charged
            self.spent -= e["reserved"]
            e["charged"], e["reserved"] = 0.0, 0.0
        e["status"], e["error"] = "FAILED", why
        keys = list(e["meta"])
        self.seen.difference_update(keys)
        if e["kind"] == "drift":  # its queries go back to the front of the queue, retried later
            old = list(self.drift_queue.items())
            self.drift_queue.clear()
            prompts = self._prompts_of(e)
            for k in keys:
                self.drift_queue[k] = {"prompt": prompts[k], "group": e["meta"][k]["group"], "reason": "retry"}
            self.drift_queue.update(old)
            self.not_before = now + self.config.retry_after_s
        self._event("failed", id=e["id"], why=why)
        self._snapshot()

    def _prompts_of(self, e: dict) -> dict:
        rows = [json.loads(x) for x in (Path(e["config"]).parent / "queries.jsonl").read_text().splitlines()]
        return {r["query_id"]: r["prompt"] for r in rows}

    def _finish(self, e: dict) -> None:
        from proxray.evaljob.job import read_parts
        from proxray.data.table import RoutingTable

        parts = read_parts(Path(e["out"]) / "table")
        self._charge(e, parts)
        if e["kind"] == "growth":
            self._absorb_models(e, parts)
        else:
            table = RoutingTable.read(Path(e["out"]) / "routing_table.parquet")
            missing = [m for m in self.models if m not in table.models]
            if missing:
                raise ValueError(f"the evaluation lacks the router's models {missing}")
            acc, cost = table.matrices(models=self.models)
            cost = np.zeros_like(acc) if cost is None else cost
            if e["kind"] == "shadow":
                for i, k in enumerate(table.query_ids):
                    self.shadow_obs[k] = {**e["meta"][k], "objective": objective(acc[i], cost[i], self.config.lam).tolist()}
                while len(self.shadow_obs) > 20 * self.config.window:
                    self.shadow_obs.popitem(last=False)
            else:
                self._absorb_queries(e, table, acc, cost)
        e["status"] = "DONE"
        self._snapshot()

    def _absorb_queries(self, e, table, acc, cost) -> None:
        """Add the labelled queries to the router (no refit) and publish a new version."""
        from proxray.routing.registry import load_router

        router = load_router(self.router_path)
        router.add_queries(self.encoder.encode(table.prompts), acc, cost if router.has_cost_ else None)
        self.train_prompts.extend(table.prompts)
        # the absorbed traffic is a training "task" now: its top-z joins the reference sets of J_z
        self.task_sets[e["id"]] = sorted(top_z(objective(acc, cost, self.config.lam).mean(0), self.config.z))
        self._publish(router, absorbed=e["id"], n=len(table.prompts))

    def _publish(self, router, **event) -> None:
        self.version += 1
        path = self.state_dir / "routers" / f"v{self.version:04d}"
        router.save(path)
        self.router, self.router_path, self.models = router, str(path), list(router.models_)
        self._event("router", version=self.version, path=str(path), **event)

    # ---- growth: a model added to the pool -----------------------------------------------------
    def _pool(self) -> list:
        return [m["id"] for m in self.config.job["models"]]

    def _maybe_grow(self, now: float) -> None:
        new = [m for m in self._pool() if m not in self.models]
        if new and self.router.n_train_ != len(self.train_prompts):
            if self.blocked != "growth":  # add_model needs the training queries in the router's order
                self._event("growth_refused", why=f"the router has {self.router.n_train_} training queries, the "
                            f"table and absorbed evaluations {len(self.train_prompts)}: refit it on the table")
            self.blocked = "growth"
            return
        if not new or self._running("growth") or any(
                e["kind"] == "growth" and e["status"] == "FAILED" and now - e["time"] < self.config.retry_after_s
                for e in self.evaluations):
            return
        rows = [{"query_id": f"train-{i}", "task": "training", "prompt": p} for i, p in enumerate(self.train_prompts)]
        reserve = len(rows) * self.est_cost * len(new) / max(len(self._pool()), 1)
        if self.spent + reserve > self.config.cost_budget:
            self.blocked = "budget"
            return
        self._record("growth", rows, {r["query_id"]: {"group": "training", "outlier": False} for r in rows},
                     reserve, now, models=new)

    def _absorb_models(self, e, parts) -> None:
        """``add_model`` for each new model, its column over the training queries in the router's order."""
        from proxray.routing.registry import load_router

        router = load_router(self.router_path)
        parts = parts.drop_duplicates(["model", "query_id"], keep="last")
        order = [f"train-{i}" for i in range(len(self.train_prompts))]
        for m in e["models"]:
            col = parts[parts["model"] == m].set_index("query_id")
            if not set(order) <= set(col.index):
                raise ValueError(f"the growth evaluation has {len(col)} of {len(order)} training queries for {m!r}")
            router.add_model(m, col.loc[order, "correct"].to_numpy(float),
                             col.loc[order, "cost"].to_numpy(float) if router.has_cost_ else None)
        self._publish(router, added_models=e["models"])

    # ---- state -----------------------------------------------------------------------------------
    def _state(self) -> dict:
        return {"seq": self.seq, "window": list(self.window), "drift_queue": list(self.drift_queue.items()),
                "shadow_queue": list(self.shadow_queue.items()), "seen": sorted(self.seen),
                "shadow_seen": sorted(self.shadow_seen),
                "shadow_obs": list(self.shadow_obs.items()), "evaluations": self.evaluations, "spent": self.spent,
                "est_cost": self.est_cost, "version": self.version, "router_path": self.router_path,
                "triggered": self.triggered, "not_before": self.not_before, "stats": self.stats, "events": self.events,
                "task_sets": self.task_sets, "train_prompts_added": self.train_prompts[self._n_table:]}

    def _snapshot(self) -> None:
        self.store.snapshot(self._state())
        self._dirty = 0

    def _restore(self) -> None:
        from proxray.routing.registry import load_router

        self._n_table = len(self.train_prompts)
        snap, entries = self.store.load()
        if snap:
            self.seq = snap["seq"]
            self.window.extend(snap["window"])
            self.drift_queue.update((k, v) for k, v in snap["drift_queue"])
            self.shadow_queue.update((k, v) for k, v in snap["shadow_queue"])
            self.seen, self.shadow_seen = set(snap["seen"]), set(snap["shadow_seen"])
            self.shadow_obs.update((k, v) for k, v in snap["shadow_obs"])
            self.evaluations, self.spent, self.est_cost = snap["evaluations"], snap["spent"], snap["est_cost"]
            self.version, self.triggered, self.not_before = snap["version"], snap["triggered"], snap["not_before"]
            self.stats, self.events, self.task_sets = snap["stats"], snap["events"], snap["task_sets"]
            self.train_prompts.extend(snap["train_prompts_added"])
            if snap["router_path"] != self.router_path:
                self.router_path = snap["router_path"]
                self.router = load_router(self.router_path)
                self.models = list(self.router.models_)
        for e in entries:  # reports after the snapshot
            self.seq = e["seq"]
            self._apply(e)
        self._dirty = len(entries)

    # ---- views -----------------------------------------------------------------------------------
    def current_router(self) -> str:
        return self.router_path

    def status(self) -> dict:
        with self.lock:
            recent = list(self.window)
            return {
                "name": self.config.name, "reported": self.stats["reported"], "drifted": self.stats["drifted"],
                "outlier_rate": float(np.mean([r["drifted"] for r in recent])) if recent else 0.0,
                "outlier_threshold": self.outlier_threshold, "overlap_threshold": self.overlap_threshold,
                "overlap": self.overlap_by_kind(), "groups": self.group_overlaps(),
                "drift_queue": len(self.drift_queue), "shadow_queue": len(self.shadow_queue),
                "shadow_labelled": len(self.shadow_obs), "dropped_full": self.stats["dropped_full"],
                "repeats": self.stats["repeats"], "spent_usd": round(self.spent, 8), "budget_usd": self.config.cost_budget,
                "est_cost_per_query": self.est_cost, "blocked": self.blocked,
                "evaluations": len([e for e in self.evaluations if e["kind"] == "drift"]),
                "jobs": [{k: e.get(k) for k in ("id", "kind", "n", "status", "charged", "error")} for e in self.evaluations[-8:]],
                "router_version": self.version, "router_path": self.router_path, "models": self.models,
                "judge": (self.config.job.get("grader") or {}).get("model"),
                "scheduler": bool(self._thread is not None and self._thread.is_alive()), "events": self.events[-10:]}

    def prometheus(self) -> str:
        s = self.status()
        lines = [f"proxray_monitor_reported_total {s['reported']}", f"proxray_monitor_drifted_total {s['drifted']}",
                 f"proxray_monitor_outlier_rate {s['outlier_rate']}", f"proxray_monitor_drift_queue {s['drift_queue']}",
                 f"proxray_monitor_shadow_labelled {s['shadow_labelled']}",
                 f"proxray_monitor_evaluations_total {s['evaluations']}", f"proxray_monitor_spent_usd {s['spent_usd']}",
                 f"proxray_monitor_router_version {s['router_version']}",
                 f"proxray_monitor_topz_overlap_threshold {s['overlap_threshold']}"]
        for kind, o in s["overlap"].items():
            if o["j"] is not None:
                lines.append(f'proxray_monitor_topz_overlap{{traffic="{kind}"}} {o["j"]}')
        for g, o in s["groups"].items():
            lines.append(f'proxray_monitor_group_topz_overlap{{group="{g}"}} {o["j"]}')
        return "\n".join(lines) + "\n"
