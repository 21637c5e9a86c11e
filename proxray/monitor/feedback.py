"""Users' scores as labels (``POST /v1/feedback`` on the endpoint, handed to the monitor by the ingress).

A score labels one model on one query: the model that answered. The monitor keeps the scores per query until they
are used, in one of two ways:

* **beside the judge's labels** — a query that waits in the drift queue, or is in an evaluation that runs, is labelled
  by that evaluation on the whole pool; each user score then replaces the judge's label of its model
  (``merge_into``), and the table of that evaluation is written again with ``grader: feedback`` on those rows;
* **on their own** — the other scored queries are added to the router in batches of ``feedback_batch`` (or fewer,
  once the oldest waited ``feedback_max_wait_s``): the scored model gets the user's score (and the answer's cost);
  every other model, which nobody scored on that query, gets the router's own estimate there (``grader: router``),
  so such a row adds evidence for the scored model only and leaves the others' estimates where they were.

Each batch's labels are written as a routing table (``state_dir/feedback/<id>/routing_table.parquet``) with the
source of every label in its ``grader`` column.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from proxray.common.storage import join

ANONYMOUS = "anonymous"  # the source of feedback from an endpoint without a keys file


class FeedbackBook:
    """Scores waiting to be used: ``pending`` key → {"prompt", "t", "labels": {model: {"score", "cost", "comment"}}};
    counters per model. Every feedback entry of the journal is applied here, live and on replay."""

    def __init__(self, max_pending: int):
        self.max_pending = max_pending
        self.pending: OrderedDict = OrderedDict()
        self.stats = {"received": 0, "absorbed": 0, "merged": 0, "dropped_full": 0, "unknown_model": 0, "set_aside": 0}
        self.by_model: dict = {}  # model -> [count, score sum]
        self.refuses = lambda source: False  # a source set aside (proxray.monitor.sources): counted, not kept

    def apply(self, e: dict) -> None:
        """A feedback entry: {"seq", "t", "kind": "feedback", "key", "prompt", "model", "score", "cost", "comment",
        "source"}."""
        self.stats["received"] += 1
        n = self.by_model.setdefault(e["model"], [0, 0.0])
        n[0], n[1] = n[0] + 1, n[1] + e["score"]
        if self.refuses(e.get("source") or ANONYMOUS):
            self.stats["set_aside"] += 1
            return
        item = self.pending.get(e["key"])
        if item is None:
            if len(self.pending) >= self.max_pending:
                self.stats["dropped_full"] += 1
                return
            item = self.pending[e["key"]] = {"prompt": e["prompt"], "t": e["t"], "labels": {}}
        item["labels"][e["model"]] = {"score": e["score"], "cost": e.get("cost"), "comment": e.get("comment"),
                                      "source": e.get("source") or ANONYMOUS}

    def drop_refused(self) -> None:
        """Scores waiting from sources set aside since they came: counted (``set_aside``), not kept."""
        for k in list(self.pending):
            labels = self.pending[k]["labels"]
            for m in [m for m, lab in labels.items() if self.refuses(lab.get("source") or ANONYMOUS)]:
                del labels[m]
                self.stats["set_aside"] += 1
            if not labels:
                del self.pending[k]

    def due(self, now: float, batch: int, max_wait_s: float, waiting: set) -> list:
        """Keys to add on their own now: ``batch`` of those not ``waiting`` for an evaluation, or fewer once the oldest
        waited ``max_wait_s``; a key that waits for an evaluation longer than ``max_wait_s`` goes too."""
        free = [k for k, v in self.pending.items() if k not in waiting or now - v["t"] >= max_wait_s]
        if not free:
            return []
        if len(free) >= batch or now - self.pending[free[0]]["t"] >= max_wait_s:
            return free[:batch]
        return []

    def take(self, keys: list) -> list:
        items = [self.pending.pop(k) for k in keys]
        self.stats["absorbed"] += len(items)
        return items

    def merge_into(self, query_ids: list, models: list, acc, cost, graders, pairs: list | None = None) -> int:
        """Replace the judge's labels in ``acc``/``cost``/``graders`` (rows ``query_ids``, columns ``models``) with the
        users' scores of the queries that have them (taken from ``pending``); returns how many queries had scores.
        ``pairs`` collects (source, user's score, judge's label) of each replaced label."""
        merged = 0
        for i, k in enumerate(query_ids):
            item = self.pending.pop(k, None)
            if item is not None:
                self.stats["unknown_model"] += put_scores(item, i, models, acc, cost, graders, pairs)
                merged += 1
        self.stats["merged"] += merged
        return merged

    def status(self) -> dict:
        return {**self.stats, "pending": len(self.pending),
                "by_model": {m: {"count": c, "mean_score": s / c} for m, (c, s) in sorted(self.by_model.items())}}

    def state(self) -> dict:
        return {"feedback": {"pending": list(self.pending.items()), "stats": self.stats, "by_model": self.by_model}}

    def restore(self, snap: dict) -> None:
        fb = snap.get("feedback")  # a snapshot from before feedback: nothing to restore
        if fb:
            self.pending.update((k, v) for k, v in fb["pending"])
            self.stats, self.by_model = {**self.stats, **fb["stats"]}, fb["by_model"]  # counters added since: 0


class FeedbackLabels:
    """The monitor's part that turns waiting scores into labels: joined to an evaluation's (``merge``) or a batch of
    their own (``batch``), each written as a routing table with the source of every label."""

    def __init__(self, book: FeedbackBook, traffic, evaluations, folder: str):
        self.book, self.traffic, self.evaluations, self.folder = book, traffic, evaluations, folder

    def waiting(self) -> set:
        """Keys an evaluation will label: queued for re-evaluation, or in a drift evaluation that runs."""
        running = [e for e in self.evaluations.items
                   if e["kind"] == "drift" and e["status"] in ("SUBMITTING", "RUNNING")]
        return set(self.traffic.drift_queue).union(*(e["meta"] for e in running))

    def merge(self, e: dict, table, models: list, acc, cost) -> list:
        """A finished drift evaluation's labels (``acc``/``cost``, changed in place) with the users' scores of its
        queries in place of the judge's; its labels written again (``out/labelled``) with their sources. Returns
        (source, user's score, judge's label) of each label replaced: a free spot check of both."""
        graders = np.full(acc.shape, "judge", dtype=object)
        pairs: list = []
        if not self.book.merge_into(list(table.query_ids), models, acc, cost, graders, pairs):
            return pairs
        write_labels(join(e["out"], "labelled"), labels_frame(list(table.query_ids), list(table.prompts), e["id"],
                                                              models, acc, np.zeros_like(acc) if cost is None else cost,
                                                              graders))
        return pairs

    def batch(self, now: float, cfg, publisher, encoder):
        """The scored queries due to be added on their own (``FeedbackBook.due``), labelled and written as a table:
        (its id, keys, prompts, embeddings, acc, cost, the scores taken), or None when none is due. They leave the drift queue: the
        users' labels stand for them now, the judge does not re-run them."""
        if not self.book.pending:  # nothing scored: not even the queues to look at
            return None
        keys = self.book.due(now, cfg.feedback_batch, cfg.feedback_max_wait_s, self.waiting())
        if not keys:
            return None
        items = self.book.take(keys)
        for k in keys:
            self.traffic.drift_queue.pop(k, None)
            self.traffic.seen.add(k)
        prompts, models = [it["prompt"] for it in items], publisher.models
        X = encoder.encode(prompts)
        acc, cost, graders, unknown = feedback_labels(items, models, *publisher.router.estimate(X))
        self.book.stats["unknown_model"] += unknown
        fid = f"{cfg.name}-feedback-v{publisher.version + 1:04d}"  # the router version it makes
        write_labels(join(self.folder, fid), labels_frame(keys, prompts, "feedback", models, acc, cost, graders))
        return fid, keys, prompts, X, acc, cost, items


def write_labels(folder: str, df) -> None:
    from proxray.data.table import RoutingTable

    RoutingTable(df).write(join(folder, "routing_table.parquet"))


def feedback_labels(items: list, models: list, acc_hat, cost_hat):
    """The labels of scored queries added on their own: the scored model's from the user, every other model's the
    router's estimate (``acc_hat``/``cost_hat`` (n, M) at those queries). Returns (acc, cost, graders (n, M), unknown)
    where ``unknown`` counts scores of models the router does not have."""
    acc, cost = np.array(acc_hat, dtype=np.float64), np.array(cost_hat, dtype=np.float64)
    graders = np.full(acc.shape, "router", dtype=object)
    unknown = sum(put_scores(item, i, models, acc, cost, graders) for i, item in enumerate(items))
    return np.clip(acc, 0.0, 1.0), np.maximum(cost, 0.0), graders, unknown


def put_scores(item: dict, i: int, models: list, acc, cost, graders, pairs: list | None = None) -> int:
    """Row ``i`` of ``acc``/``cost``/``graders`` takes the users' scores of ``item`` (and the answers' costs, where
    known and ``cost`` is not None), marked ``feedback:<source>``; returns how many scores name a model not in
    ``models``. ``pairs`` (where given) collects (source, score, the label it replaced) where a judge's label is
    replaced."""
    unknown = 0
    for model, lab in item["labels"].items():
        if model not in models:
            unknown += 1
            continue
        j = models.index(model)
        source = lab.get("source") or ANONYMOUS
        if pairs is not None and graders[i, j] == "judge":
            pairs.append((source, lab["score"], float(acc[i, j])))
        acc[i, j], graders[i, j] = lab["score"], f"feedback:{source}"
        if cost is not None and lab["cost"] is not None:
            cost[i, j] = lab["cost"]
    return unknown


def labels_frame(keys: list, prompts: list, task: str, models: list, acc, cost, graders):
    """The long-form routing table of labelled queries, the source of each label in ``grader``."""
    import pandas as pd

    n, M = acc.shape
    return pd.DataFrame({"query_id": np.repeat(keys, M), "task": task, "prompt": np.repeat(prompts, M),
                         "model": np.tile(models, n), "correct": acc.ravel(), "cost": cost.ravel(),
                         "grader": np.asarray(graders, dtype=object).ravel()})
