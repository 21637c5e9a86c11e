"""Drift monitor: watches routed traffic, detects queries the router was not trained for, and has
them evaluated on every pool model so the router can absorb them (paper §4, "Outlier gaps and
Router Retraining").

Signals, per routed query (reported by the router deployment, fire-and-forget):

* the outlier score: distance to the nearest training query, against a threshold chosen on the
  training set itself (the ``quantile`` of leave-one-out nearest-neighbour distances);
* J_z(λ): the top-z Jaccard overlap between the model ranking of recent traffic — a sliding window,
  grouped by nearest cluster of the training embeddings, ranked by the router's estimated objective —
  and the rankings of the training tasks (observed objective); a group's overlap is that of its
  best-matching training task, and the window's is the mean over groups.

A query is *drifted* when its outlier score is over the threshold. Drifted queries are buffered; when
the buffer reaches ``min_batch`` (and the hourly evaluation limit and the cost budget allow), the
monitor labels them (an injected ``labeler``) and submits the evaluation job through the Ray Jobs API.
When that job has finished, ``absorb`` adds the newly labeled queries to the router incrementally and
writes a new artifact version for the router deployment to switch to.

``DriftMonitor`` is a plain class (tests use it directly); ``start_monitor`` runs it as a named,
detached Ray actor whose state is checkpointed to disk after every change and restored on restart.
"""
from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path

import numpy as np

from .metrics import jaccard


class DriftMonitor:
    """Parameters: ``router_path`` (artifact), ``table_path`` (its training table), ``state_dir``
    (checkpoints, buffers, new artifacts), ``z``, ``lam``, ``window``, ``n_groups``, ``quantile``,
    ``min_batch``, ``max_evals_per_hour``, ``cost_budget`` (USD of evaluation), ``est_cost_per_query``
    (USD to evaluate one query on the whole pool), ``job_config`` (evaluation job template: dict of
    ``proxray.evaljob.JobConfig`` without query_sets), ``labeler`` (records -> query rows with answers),
    ``submit`` ("jobs_api" | "inline"), ``jobs_address``."""

    def __init__(self, router_path, table_path, state_dir, z=3, lam=0.0, window=200, n_groups=8, quantile=0.99,
                 overlap_threshold=None, min_group=5,
                 min_batch=20, max_evals_per_hour=4, cost_budget=1.0, est_cost_per_query=1e-3, job_config=None,
                 labeler=None, submit="jobs_api", jobs_address=None, encoder=None):
        from sklearn.cluster import KMeans

        from .artifact import load_router
        from .embed import SentenceEncoder
        from .index import normalize
        from .table import RoutingTable

        self.router_path, self.state_dir = str(router_path), Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.z, self.lam, self.min_batch = z, lam, min_batch
        self.overlap_threshold, self.min_group = overlap_threshold, min_group
        self.max_evals_per_hour, self.cost_budget, self.est_cost = max_evals_per_hour, cost_budget, est_cost_per_query
        self.job_config, self.labeler, self.submit, self.jobs_address = job_config, labeler, submit, jobs_address
        router = load_router(router_path)
        self.encoder = encoder or SentenceEncoder(progress=False)
        table = RoutingTable.read(table_path)
        acc, cost = table.matrices(models=router.models_)
        cost = np.zeros_like(acc) if cost is None else cost
        X = normalize(self.encoder.encode(table.prompts))
        # Training-task rankings S_z(t, λ) from observed objectives.
        self.task_sets = {}
        for t in sorted(set(table.tasks)):
            m = table.tasks == t
            u = acc[m].mean(0) - lam * cost[m].mean(0)
            self.task_sets[str(t)] = frozenset(np.argsort(-u, kind="stable")[:z].tolist())
        # Groups for live traffic: clusters of the training embeddings.
        self.centers = KMeans(n_clusters=min(n_groups, len(X)), random_state=0, n_init=1).fit(X).cluster_centers_
        self.centers = normalize(self.centers.astype(np.float32))
        # Threshold on the outlier score, from the training set alone: leave-one-out NN distances.
        sims = X @ X.T
        np.fill_diagonal(sims, -np.inf)
        loo = 1.0 - sims.max(1)
        self.outlier_threshold = float(np.quantile(loo, quantile))
        self.window = deque(maxlen=window)
        self.buffer: list[dict] = []
        self.evaluations: list[dict] = []  # {"time", "job_id", "n", "status", "table"}
        self.spent = 0.0
        self.version = 0
        self.stats = {"reported": 0, "drifted": 0}
        self._restore()

    # ---- state -------------------------------------------------------------------------------
    @property
    def _ckpt(self) -> Path:
        return self.state_dir / "monitor_state.json"

    def _checkpoint(self):
        state = {"window": list(self.window), "buffer": self.buffer, "evaluations": self.evaluations,
                 "spent": self.spent, "version": self.version, "stats": self.stats, "router_path": self.router_path}
        tmp = self._ckpt.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self._ckpt)

    def _restore(self):
        if self._ckpt.exists():
            s = json.loads(self._ckpt.read_text())
            self.window.extend(s["window"])
            self.buffer, self.evaluations = s["buffer"], s["evaluations"]
            self.spent, self.version, self.stats = s["spent"], s["version"], s["stats"]
            self.router_path = s["router_path"]

    # ---- traffic -----------------------------------------------------------------------------
    def report(self, query_id: str, prompt: str, embedding, utility, chosen: int, outlier_score: float):
        """One routed query: its embedding (d,), the router's estimated objective per model (M,)."""
        e = np.asarray(embedding, dtype=np.float32)
        group = int(np.argmax(self.centers @ (e / max(np.linalg.norm(e), 1e-12))))
        drifted = bool(outlier_score > self.outlier_threshold)
        self.window.append({"group": group, "utility": [float(u) for u in utility], "drifted": drifted,
                            "outlier_score": float(outlier_score)})
        if not drifted and self.overlap_threshold is not None:
            j = self._group_overlap(group)
            drifted = j is not None and j < self.overlap_threshold
            self.window[-1]["drifted"] = drifted
        self.stats["reported"] += 1
        if drifted:
            self.stats["drifted"] += 1
            self.buffer.append({"query_id": query_id, "prompt": prompt})
        self._checkpoint()
        return drifted

    def _group_overlap(self, group: int, min_group: int | None = None) -> float | None:
        """Top-z overlap of one group's recent traffic (by estimated objective) with its best-matching
        training task, or None with fewer than ``min_group`` queries in the window."""
        rows = [r["utility"] for r in self.window if r["group"] == group]
        if len(rows) < (self.min_group if min_group is None else min_group):
            return None
        s = frozenset(np.argsort(-np.mean(rows, 0), kind="stable")[: self.z].tolist())
        return max(jaccard(s, t) for t in self.task_sets.values())

    def overlap(self, min_group: int | None = None) -> float | None:
        """J_z over the window: the mean of the groups' overlaps (groups with at least ``min_group``
        queries), or None if no group has enough."""
        scores = [self._group_overlap(g, min_group) for g in {r["group"] for r in self.window}]
        scores = [x for x in scores if x is not None]
        return float(np.mean(scores)) if scores else None

    def status(self) -> dict:
        recent = list(self.window)
        return {"reported": self.stats["reported"], "drifted": self.stats["drifted"],
                "outlier_rate": float(np.mean([r["drifted"] for r in recent])) if recent else 0.0,
                "overlap": self.overlap(), "outlier_threshold": self.outlier_threshold, "buffer": len(self.buffer),
                "evaluations": len(self.evaluations), "spent_usd": self.spent, "router_version": self.version,
                "router_path": self.router_path, "jobs": self.evaluations[-5:]}

    def prometheus(self) -> str:
        s = self.status()
        lines = [f"proxray_monitor_reported_total {s['reported']}", f"proxray_monitor_drifted_total {s['drifted']}",
                 f"proxray_monitor_outlier_rate {s['outlier_rate']}", f"proxray_monitor_buffer {s['buffer']}",
                 f"proxray_monitor_evaluations_total {s['evaluations']}", f"proxray_monitor_spent_usd {s['spent_usd']}"]
        if s["overlap"] is not None:
            lines.append(f"proxray_monitor_topz_overlap {s['overlap']}")
        return "\n".join(lines) + "\n"

    # ---- re-evaluation -----------------------------------------------------------------------
    def maybe_evaluate(self, now: float | None = None):
        """Submit an evaluation of the buffered drifted queries when the batch is big enough and the
        rate limit and budget allow. Returns the job id or None."""
        now = time.time() if now is None else now
        if len(self.buffer) < self.min_batch or any(e["status"] in ("PENDING", "RUNNING") for e in self.evaluations):
            return None
        if sum(now - e["time"] < 3600 for e in self.evaluations) >= self.max_evals_per_hour:
            return None
        batch = self.buffer[: max(self.min_batch, len(self.buffer))]
        cost = len(batch) * self.est_cost
        if self.spent + cost > self.cost_budget:
            return None
        queries = self.labeler(batch)  # -> DataFrame of query rows with answers (None rows = unlabeled)
        n = self.version + 1
        qpath = self.state_dir / f"eval{n}_queries.jsonl"
        queries.to_json(qpath, orient="records", lines=True)
        out = self.state_dir / f"eval{n}_table"
        cfg = {**self.job_config, "output": str(out), "query_sets": [{"name": f"drift{n}", "path": str(qpath)}]}
        cpath = self.state_dir / f"eval{n}_config.yaml"
        import yaml

        cpath.write_text(yaml.safe_dump(cfg))
        job_id = self._submit(cpath, out)
        self.evaluations.append({"time": now, "job_id": job_id, "n": len(batch), "status": "RUNNING",
                                 "table": str(out / "routing_table.parquet"), "config": str(cpath)})
        self.spent += cost
        self.buffer = self.buffer[len(batch):]
        self._checkpoint()
        return job_id

    def _submit(self, config_path, out) -> str:
        if self.submit == "inline":  # for tests without a Jobs API server: same job, this process
            from .evaljob import load_config, run_job

            run_job(load_config(config_path), out)
            return "inline-" + Path(out).name
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(self.jobs_address)
        import shlex
        import sys

        cmd = f"{shlex.quote(sys.executable)} -m proxray.cli build-table --config {shlex.quote(str(config_path))} --output {shlex.quote(str(out))}"
        return client.submit_job(entrypoint=cmd)  # Ray's token auth as the cluster has it (the client sends the token)

    def poll(self) -> str | None:
        """Check the running evaluation; when it has succeeded, absorb it. Returns the new router path."""
        running = [e for e in self.evaluations if e["status"] == "RUNNING"]
        if not running:
            return None
        e = running[-1]
        if not e["job_id"].startswith("inline-"):
            from ray.job_submission import JobSubmissionClient

            status = str(JobSubmissionClient(self.jobs_address).get_job_status(e["job_id"]))
            status = status.split(".")[-1]
            if status not in ("SUCCEEDED", "FAILED", "STOPPED"):
                return None
            if status != "SUCCEEDED":
                e["status"] = status
                self._checkpoint()
                return None
        e["status"] = "SUCCEEDED"
        return self.absorb(e["table"])

    def absorb(self, table_path) -> str:
        """Add the labeled queries of ``table_path`` to the router (no refit) and save a new version."""
        from .artifact import load_router
        from .table import RoutingTable

        router = load_router(self.router_path)
        table = RoutingTable.read(table_path)
        acc, cost = table.matrices(models=router.models_)
        router.add_queries(self.encoder.encode(table.prompts), acc, cost if router.has_cost_ else None)
        self.version += 1
        path = self.state_dir / f"router_v{self.version}"
        router.save(path)
        self.router_path = str(path)
        self._checkpoint()
        return self.router_path


def start_monitor(name: str = "proxray-monitor", namespace: str = "proxray", **kwargs):
    """The monitor as a named, detached Ray actor (get it again with ``ray.get_actor(name, namespace)``);
    it restarts on failure and restores its checkpoint."""
    import ray

    actor_cls = ray.remote(max_restarts=-1, max_task_retries=-1, num_cpus=0.25)(DriftMonitor)
    return actor_cls.options(name=name, namespace=namespace, lifetime="detached", get_if_exists=True).remote(**kwargs)
