"""Label sources the monitor learns from — the judge, and each key's feedback — each spot-checked against evidence it
does not control, its agreement kept and shown; a source under the floor is set aside (a log line, the metric
``proxray_monitor_label_source_set_aside``) and trains nothing more.

* **The judge** grades *canaries* in every evaluation it labels: training queries with their table labels (reference
  graded when the table was made); its verdicts are compared with those labels, model by model. A model answers a
  prompt it was evaluated on much as it did then (greedy decoding), so an accurate judge agrees with most of them
  and one that grades at random with half (the floor, 0.75 by default, leaves room for answers that changed).
* **A key's feedback** is compared with the judge's verdict on the same query and model: in an evaluation that
  labels a scored query (the judge's label before the user's replaces it, free), and on a sample of each feedback
  batch (``spot_checks`` queries, evaluated with the judge before the batch may train the router).

A source is trusted while its agreement over every cell checked is at least ``trust_floor``; the judge's checks count
only while the judge is trusted (an untrusted judge cannot vouch for feedback)."""
from __future__ import annotations

import logging

import numpy as np

from proxray.common.hashing import unit_hash

logger = logging.getLogger("proxray.monitor")
JUDGE = "judge"


class LabelSources:
    """``tally`` {source: {"checked", "agree", "set_aside"}}; ``canary_pool`` the training sample's rows with their
    labels' sides (row, [(model index, right?)]), from which each evaluation takes its canaries."""

    def __init__(self, spec, rows, acc):
        self.spec = spec
        self.tally: dict = {}
        self.canary_pool = [(int(r), [(m, bool(a > 0.5)) for m, a in enumerate(row)]) for r, row in zip(rows, acc)]

    # ---- what a source is worth --------------------------------------------------------------------------------
    def of(self, source: str) -> dict:
        return self.tally.setdefault(source, {"checked": 0, "agree": 0, "set_aside": False})

    def agreement(self, source: str) -> float | None:
        t = self.tally.get(source)
        return t["agree"] / t["checked"] if t and t["checked"] else None

    def trusted(self, source: str) -> bool:
        """Checked at least once and at or above the floor (and not set aside)."""
        a = self.agreement(source)
        return a is not None and a >= self.spec.trust_floor and not self.tally[source]["set_aside"]

    def set_aside(self, source: str) -> bool:
        return bool(self.tally.get(source, {}).get("set_aside"))

    def count(self, source: str, agree) -> None:
        """Cells checked for ``source`` (booleans: agreed or not); under the floor after them, it is set aside."""
        agree = np.asarray(agree, dtype=bool)
        t = self.of(source)
        t["checked"] += int(agree.size)
        t["agree"] += int(agree.sum())
        a = self.agreement(source)
        if a is not None and a < self.spec.trust_floor and not t["set_aside"]:
            t["set_aside"] = True
            logger.warning("proxray monitor: label source %r set aside: it agreed %.2f with the spot checks on %d "
                           "cells, under the floor %.2f", source, a, t["checked"], self.spec.trust_floor)

    # ---- the judge's canaries ----------------------------------------------------------------------------------
    def canaries(self, salt: str) -> list:
        """Training rows for one evaluation, a seeded choice, until they hold ``canary_cells`` cells.
        [(row, [(model index, right?)])]."""
        out, cells = [], 0
        for c in sorted(self.canary_pool, key=lambda c: unit_hash(salt, c[0])):
            if cells >= self.spec.canary_cells:
                break
            out.append(c)
            cells += len(c[1])
        return out

    def check_judge(self, cells: list, labels: dict) -> dict:
        """``cells`` [(canary query id, model index, side)]; ``labels`` {(query id, model index): judge's label}.
        Counts the judge's agreement; returns this evaluation's figures."""
        got = [(labels[(q, m)] > 0.5) == side for q, m, side in cells if (q, m) in labels]
        if got:
            self.count(JUDGE, got)
        return {"cells": len(got), "agree": int(np.sum(got)), "agreement": self.agreement(JUDGE)}

    def check_feedback(self, pairs: list) -> dict:
        """``pairs`` [(source, user's score, judge's label)] — checked only while the judge is trusted."""
        if not self.trusted(JUDGE):
            return {}
        by: dict = {}
        for source, score, judged in pairs:
            by.setdefault(source, []).append((score > 0.5) == (judged > 0.5))
        for source, agree in by.items():
            self.count(source, agree)
        return {s: {"cells": len(a), "agree": int(np.sum(a))} for s, a in by.items()}

    def status(self) -> dict:
        return {s: {**t, "agreement": None if not t["checked"] else round(t["agree"] / t["checked"], 4),
                    "trusted": self.trusted(s)} for s, t in sorted(self.tally.items())}

    def state(self) -> dict:
        return {"label_sources": self.tally}

    def restore(self, snap: dict) -> None:
        self.tally = snap.get("label_sources", {}) or {}
