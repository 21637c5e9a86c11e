"""Evaluations the monitor runs through the evaluation job, and what they cost.

Each is recorded (its queries, its job config and its submission id, derived from its content) and checkpointed
*before* it is submitted: a restarted monitor submits the same id again and the Jobs API refuses a duplicate.
An estimate is reserved against the USD budget at submission; the job's real generation + judge cost is charged
when it ends (done, failed or timed out). A job that failed or that the Jobs API lost (its driver gone with a node, a
head restarted) is submitted again once, as ``<id>-retry1`` with the same config and output: the evaluation job
resumes from the rows the first run wrote (keyed on their content), so nothing is evaluated or paid for twice."""
from __future__ import annotations

import hashlib
import json
import logging

from proxray.common.storage import join, read_file, split_location, write_file

logger = logging.getLogger("proxray.monitor")
RETRIES = 1  # a failed or lost job is submitted again this many times (it resumes; a timed-out one is not)


class Evaluations:
    """``items``: one dict per evaluation ({"id", "kind", "n", "status", "time", "submitted", "reserved", "charged",
    "config", "out", "meta", "models"}, status SUBMITTING → RUNNING → DONE / FAILED); ``spent`` USD charged plus
    reserved; ``est_cost`` per query (pool + judge), learnt from what jobs really cost. ``checkpoint()`` is called
    where the state must be durable before going on."""

    def __init__(self, name: str, folder, runner, budget: float, est_cost: float, checkpoint):
        self.name, self.folder, self.runner, self.budget = name, str(folder), runner, budget
        self.est_cost, self.checkpoint = est_cost, checkpoint
        self.items: list = []
        self.spent = 0.0

    def state(self) -> dict:
        """What a snapshot keeps of it: every evaluation, the USD spent and the cost estimate per query."""
        return {"evaluations": self.items, "spent": self.spent, "est_cost": self.est_cost}

    def restore(self, snap: dict) -> None:
        self.items, self.spent, self.est_cost = snap["evaluations"], snap["spent"], snap["est_cost"]

    def running(self, kind: str) -> bool:
        return any(e["kind"] == kind and e["status"] in ("SUBMITTING", "RUNNING") for e in self.items)

    def started_within(self, kind: str, now: float, seconds: float) -> int:
        return sum(now - e["time"] < seconds for e in self.items if e["kind"] == kind)

    def failed_within(self, kind: str, now: float, seconds: float) -> bool:
        return any(e["kind"] == kind and e["status"] == "FAILED" and now - e["time"] < seconds for e in self.items)

    def affordable(self, reserve: float) -> bool:
        return self.spent + reserve <= self.budget

    def record(self, kind: str, rows: list, meta: dict, reserve: float, now: float, job, models=None,
               extra: dict | None = None) -> dict:
        """Write the evaluation's queries and job config (``job``: the monitor's ``JobTemplate``), record it (with its
        submission id and ``extra``, what its end needs) durably, submit it."""
        n = sum(1 for e in self.items if e["kind"] == kind) + 1
        digest = hashlib.sha256(json.dumps([r["query_id"] for r in rows]).encode()).hexdigest()[:8]
        sid = f"{self.name}-{kind}-{n:04d}-{digest}"
        import yaml

        folder = join(self.folder, sid)
        qpath = write_file(join(folder, "queries.jsonl"), "".join(json.dumps(r) + "\n" for r in rows).encode())
        cfg_path = write_file(join(folder, "job.yaml"),
                              yaml.safe_dump({**job.model_dump(mode="json", exclude_none=True),
                                              "query_sets": [{"name": kind, "path": qpath}]}).encode())
        e = {"id": sid, "kind": kind, "n": len(rows), "status": "SUBMITTING", "time": now, "submitted": None,
             "reserved": reserve, "charged": None, "config": cfg_path, "out": join(folder, "out"),
             "meta": meta, "models": models, **(extra or {})}
        self.items.append(e)
        self.spent += reserve
        self.checkpoint()  # recorded before submitting: a restart finds it and submits the same id
        self.submit(e, now)
        return e

    @staticmethod
    def job(e: dict) -> str:
        """The submission id of the evaluation's current job: its id, or ``<id>-retryN`` once resubmitted."""
        return e.get("job", e["id"])

    def submit(self, e: dict, now: float) -> None:
        try:
            self.runner.submit(self.job(e), e["config"], e["out"], e.get("models"))
        except Exception as err:  # noqa: BLE001 - the Jobs API is down: try again next tick
            logger.warning("proxray monitor: submitting %s failed: %s", self.job(e), err)
            return
        e["status"], e["submitted"] = "RUNNING", now
        self.checkpoint()

    def submit_pending(self, now: float) -> None:
        for e in [e for e in self.items if e["status"] == "SUBMITTING"]:
            self.submit(e, now)

    def outcomes(self, now: float, timeout_s: float):
        """(evaluation, "SUCCEEDED" or why it failed) for each running one that ended or ran past ``timeout_s``."""
        for e in [e for e in self.items if e["status"] == "RUNNING"]:
            status = self.runner.status(self.job(e))
            if status == "SUCCEEDED":
                yield e, status
            elif status in ("FAILED", "MISSING") and e.get("retries", 0) < RETRIES:
                e["retries"] = e.get("retries", 0) + 1
                e["job"] = f"{e['id']}-retry{e['retries']}"
                logger.warning("proxray monitor: evaluation %s: job %s; submitted again as %s (it resumes)", e["id"],
                               status.lower(), e["job"])
                e["status"] = "SUBMITTING"
                self.checkpoint()  # recorded before submitting, as the first
                self.submit(e, now)
            elif status in ("FAILED", "STOPPED", "MISSING"):
                yield e, f"job {status.lower()}"
            elif now - (e["submitted"] or e["time"]) > timeout_s:
                self.runner.stop(self.job(e))
                yield e, f"timed out after {timeout_s:.0f} s"

    def charge(self, e: dict, rows) -> None:
        """The job's real cost (its rows' generation and judge cost) replaces what was reserved for it."""
        actual = float(rows["cost"].fillna(0).sum() + (rows["judge_cost"].fillna(0).sum() if "judge_cost" in rows else 0.0))
        self.spent += actual - e["reserved"]
        e["charged"], e["reserved"] = actual, 0.0
        if e["n"] and actual > 0 and e["kind"] != "growth":
            self.est_cost = 0.5 * self.est_cost + 0.5 * actual / e["n"]

    def fail(self, e: dict, why: str) -> None:
        """Charge what was evaluated before it ended (nothing readable: nothing), and mark it failed."""
        from proxray.evaljob import graded_parts

        try:
            self.charge(e, graded_parts(e["out"]))
        except Exception:  # noqa: BLE001 - nothing readable: nothing charged
            self.spent -= e["reserved"]
            e["charged"], e["reserved"] = 0.0, 0.0
        e["status"], e["error"] = "FAILED", why

    @staticmethod
    def prompts(e: dict) -> dict:
        queries = join(split_location(e["config"])[0], "queries.jsonl")
        rows = [json.loads(x) for x in read_file(queries).decode().splitlines()]
        return {r["query_id"]: r["prompt"] for r in rows}
