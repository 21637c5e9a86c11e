"""True J_z: how much of each traffic group's observed top-z models (by acc − λ·cost on shadow-evaluated
queries) it shares with the training tasks' top-z, averaged over the training tasks as in the paper. The top-z sets
and their tie rule are ``proxray.experiments.metrics.top_z``'s, the objective ``proxray.routing.objective``'s."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from proxray.experiments.metrics import jaccard, top_z
from proxray.routing.objective import objective


class OverlapTracker:
    """``task_sets`` {task: top-z model indices}; ``observed`` {query key: {"group", "outlier", "objective": [M]}}
    (at most ``max_observed``, oldest dropped); groups count once they hold ``min_group`` labelled queries."""

    def __init__(self, acc, cost, tasks, lam: float, z: int, min_group: int, threshold, max_observed: int):
        self.lam, self.z, self.min_group, self.max_observed = lam, z, min_group, max_observed
        tasks = np.asarray(tasks)
        u = objective(acc, cost, lam)
        self.task_sets = {str(t): sorted(top_z(u[tasks == t].mean(0), z)) for t in sorted(set(tasks))}
        self.observed: OrderedDict = OrderedDict()
        self.threshold = self._auto() if threshold == "auto" else float(threshold)

    def _auto(self) -> float:
        """Half the mean J_z of the training tasks against each other: a group that shares less than half as
        much of its top-z with the training tasks as they share among themselves is new territory."""
        sets = {t: frozenset(s) for t, s in self.task_sets.items()}
        if len(sets) < 2:
            return 0.0
        own = [np.mean([jaccard(s, o) for u, o in sets.items() if u != t]) for t, s in sets.items()]
        return float(0.5 * np.mean(own))

    def top_of(self, acc, cost) -> list:
        """The top-z models of labelled queries (``acc``/``cost`` (n, M)) by the mean objective."""
        return sorted(int(m) for m in top_z(objective(acc, cost, self.lam).mean(0), self.z))

    def add_task(self, name: str, acc, cost) -> None:
        """Labelled traffic absorbed into the router is a training "task" now: its top-z joins the reference sets."""
        self.task_sets[name] = self.top_of(acc, cost)

    def observe(self, key: str, meta: dict, acc, cost) -> None:
        """One shadow-evaluated query: its observed objective per model."""
        self.observed[key] = {**meta, "objective": objective(acc, cost, self.lam).tolist()}
        while len(self.observed) > self.max_observed:
            self.observed.popitem(last=False)

    def j(self, objectives) -> float:
        s = top_z(np.mean(objectives, 0), self.z)
        return float(np.mean([jaccard(s, frozenset(t)) for t in self.task_sets.values()]))

    def by_group(self) -> dict:
        """{group: {"j", "n"}} from the shadow-labelled queries, groups with at least ``min_group``."""
        by = {}
        for o in self.observed.values():
            by.setdefault(o["group"], []).append(o["objective"])
        return {g: {"j": round(self.j(v), 4), "n": len(v)} for g, v in sorted(by.items()) if len(v) >= self.min_group}

    def by_kind(self) -> dict:
        """J_z of all shadow-labelled inlier traffic and of all outlier traffic (None below ``min_group``)."""
        out = {}
        for kind, flag in (("inlier", False), ("outlier", True)):
            v = [o["objective"] for o in self.observed.values() if o["outlier"] == flag]
            out[kind] = {"j": round(self.j(v), 4) if len(v) >= self.min_group else None, "n": len(v)}
        return out

    def state(self) -> dict:
        """What a snapshot keeps of it: the shadow-labelled queries and the reference top-z sets."""
        return {"shadow_obs": list(self.observed.items()), "task_sets": self.task_sets}

    def restore(self, snap: dict) -> None:
        self.observed.update((k, v) for k, v in snap["shadow_obs"])
        self.task_sets = snap["task_sets"]

    def of(self, keys) -> dict:
        """J_z of the shadow-labelled queries among ``keys``."""
        v = [o["objective"] for k, o in self.observed.items() if k in keys]
        return {"j": round(self.j(v), 4) if v else None, "n": len(v)}
