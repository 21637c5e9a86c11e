"""What an ended evaluation does to the monitor's state: a succeeded one's labels become new model columns (growth),
observed J_z (shadow) or new training queries of the router (drift, published as a new version); a failed one is
charged what it evaluated and its drift queries go back to the front of the queue."""
from __future__ import annotations

import logging

import numpy as np

from proxray.common.storage import join

logger = logging.getLogger("proxray.monitor")


class Absorber:
    def __init__(self, config, encoder, book, overlap, evaluations, labels, publisher, decisions):
        self.config, self.encoder, self.book, self.overlap = config, encoder, book, overlap
        self.evaluations, self.labels, self.publisher, self.decisions = evaluations, labels, publisher, decisions

    def fail(self, e: dict, now: float, why: str) -> None:
        """Charge what it evaluated and mark it failed; a drift evaluation's queries go back to the front of the queue,
        retried after ``retry_after_s``."""
        self.evaluations.fail(e, why)
        keys = list(e["meta"])
        if e["kind"] == "drift":  # its queries go back to the front of the queue (and out of seen), retried later
            prompts = self.evaluations.prompts(e)
            self.book.give_back(keys, {k: {"prompt": prompts[k], "group": e["meta"][k]["group"], "reason": "retry"}
                                       for k in keys})
            self.decisions.not_before = now + self.config.retry_after_s
        else:
            self.book.seen.difference_update(keys)
        self.book.event("failed", id=e["id"], why=why)

    def finish(self, e: dict) -> None:
        """A succeeded evaluation's labels: new model columns (growth), observed J_z (shadow) or new training
        queries of the router (drift), a new router version published for the last two kinds that change it."""
        from proxray.data.table import RoutingTable
        from proxray.evaljob import graded_parts

        parts = graded_parts(e["out"])
        self.evaluations.charge(e, parts)
        if e["kind"] == "growth":  # each new model a column over the training queries, in the router's order
            ids = [f"train-{i}" for i in range(len(self.decisions.train_prompts))]
            self.publish(self.publisher.with_models(parts, ids, e["models"]), added_models=e["models"])
        else:
            table = RoutingTable.read(join(e["out"], "routing_table.parquet"))
            models = self.publisher.models
            missing = [m for m in models if m not in table.models]
            if missing:
                raise ValueError(f"the evaluation lacks the router's models {missing}")
            acc, cost = table.matrices(models=models)
            cost = np.zeros_like(acc) if cost is None else cost
            if e["kind"] == "shadow":
                for i, k in enumerate(table.query_ids):
                    self.overlap.observe(k, e["meta"][k], acc[i], cost[i])
            else:  # add the labelled queries to the router (no refit); they are a training "task" for J_z now
                self.labels.merge(e, table, self.publisher.models, acc, cost)
                router = self.publisher.with_queries(self.encoder.encode(table.prompts), acc, cost,
                                                     query_ids=self.decisions.public_ids(table.query_ids),
                                                     tasks=list(table.tasks))
                self.decisions.train_prompts.extend(table.prompts)
                self.overlap.add_task(e["id"], acc, cost)
                self.publish(router, absorbed=e["id"], n=len(table.prompts))
        e["status"] = "DONE"

    def rollback(self, to: int | None = None) -> dict:
        """Serve version ``to`` again (``RouterPublisher.rollback``). The training queries the monitor tracks follow
        the served router: those only the rolled-back versions held are no longer its own (nor evaluated again)."""
        moved = self.publisher.rollback(to)
        del self.decisions.train_prompts[max(self.publisher.router.n_train_, self.decisions.n_table):]
        self.book.event("rollback", **{k: moved[k] for k in ("from", "to")})
        logger.warning("proxray monitor: router version %d rolled back; serving version %d", moved["from"], moved["to"])
        return moved

    def publish(self, router, **event) -> None:
        path = self.publisher.publish(router, **event)
        self.book.event("router", version=self.publisher.version, path=path, **event)

