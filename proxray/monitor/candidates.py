"""A router version between the gate and the replicas: the candidate in its shadow window, and the served versions'
live feedback that can roll one back.

**Shadow.** While a candidate is in its window (``window_requests`` routed requests or ``window_s`` seconds, which
comes first), every request the ingress reports is routed by it *beside* the served router inside the monitor (the
report is fire-and-forget: the request never waits for it): decision agreement, the utility each expects of its own
choice, and how many requests each calls outliers. The window's rule: on the requests the served router calls
inliers, the candidate must choose as it does at least ``min_inlier_agreement`` of the time — a version that learned
new territory keeps its old ground.

**Live watch.** Each feedback score counts for the version served when it came. A version the gate promoted is
rolled back by itself when its mean score, over at least ``rollback_min_feedback`` scores, falls more than
``rollback_margin`` under the mean its predecessor had while it served (over as many).
"""
from __future__ import annotations

import time

import numpy as np

from proxray.routing.objective import choose


def _empty() -> dict:
    return {"n": 0, "agree": 0, "inliers": 0, "inlier_agree": 0, "u_served": 0.0, "u_candidate": 0.0,
            "outliers_served": 0, "outliers_candidate": 0}


class Candidates:
    """``current`` (the candidate in its window: version, path, start, figures, what its promotion changes), its loaded
    router, the tallies of its window, the last gate decision and each served version's live feedback."""

    def __init__(self, spec, lam: float, threshold: float):
        self.spec, self.lam, self.threshold = spec, lam, threshold
        self.current: dict | None = None
        self.router = None
        self.last: dict | None = None
        self.decided = {"promoted": 0, "rejected": 0}
        self.watch: dict = {}  # str(version) -> [count, score sum]

    def open(self, version: int, path: str, router, figures: dict, effects: dict, now: float | None = None) -> None:
        """A candidate that passed the held-out gate enters its window."""
        self.current = {"version": version, "path": path, "t": time.time() if now is None else now,
                        "figures": figures, "effects": effects, "shadow": _empty()}
        self.router = router

    def shadow(self, served, x) -> None:
        """One routed request (its embedding), routed by both routers; nothing answers from the candidate."""
        if self.current is None or self.router is None:
            return
        x = np.asarray(x, dtype=np.float32).reshape(1, -1)
        a_s, c_s, o_s = served.estimate_with_outlier_score(x)
        a_c, c_c, o_c = self.router.estimate_with_outlier_score(x)
        M = a_s.shape[1]
        ps, pc = int(choose(a_s, c_s, self.lam)[0]), int(choose(a_c, c_c, self.lam)[0])
        t = self.current["shadow"]
        same = pc == ps if pc < M else False  # a model only the candidate has: a different decision
        inlier = float(o_s[0]) <= self.threshold
        t["n"] += 1
        t["agree"] += int(same)
        t["inliers"] += int(inlier)
        t["inlier_agree"] += int(inlier and same)
        t["u_served"] += float(a_s[0, ps] - self.lam * c_s[0, ps])
        t["u_candidate"] += float(a_c[0, pc] - self.lam * c_c[0, pc])
        t["outliers_served"] += int(not inlier)
        t["outliers_candidate"] += int(float(o_c[0]) > self.threshold)

    def window_closed(self, now: float) -> bool:
        c = self.current
        return c is not None and (c["shadow"]["n"] >= self.spec.window_requests or now - c["t"] >= self.spec.window_s)

    def verdict(self) -> tuple[bool, str, dict]:
        """(promote?, why, the window's figures) once the window closed."""
        t = self.current["shadow"]
        figs = {"requests": t["n"], "agreement": None if not t["n"] else round(t["agree"] / t["n"], 4),
                "inliers": t["inliers"],
                "inlier_agreement": None if not t["inliers"] else round(t["inlier_agree"] / t["inliers"], 4),
                "expected_utility": {"served": None if not t["n"] else round(t["u_served"] / t["n"], 5),
                                     "candidate": None if not t["n"] else round(t["u_candidate"] / t["n"], 5)},
                "outliers": {"served": t["outliers_served"], "candidate": t["outliers_candidate"]}}
        if t["inliers"] and figs["inlier_agreement"] < self.spec.min_inlier_agreement:
            return False, (f"in its shadow window it chose differently on the served router's inliers: agreement "
                           f"{figs['inlier_agreement']:.2f} on {t['inliers']} < {self.spec.min_inlier_agreement}"), figs
        return True, f"shadow window: {t['n']} requests, inlier agreement {figs['inlier_agreement']}", figs

    def close(self, version: int, promoted: bool, why: str, figures: dict) -> None:
        self.last = {"version": version, "decision": "promoted" if promoted else "rejected", "why": why,
                     "figures": figures, "at": time.time()}
        self.decided["promoted" if promoted else "rejected"] += 1
        if self.current is not None and self.current["version"] == version:
            self.current, self.router = None, None

    # ---- live feedback per served version ----------------------------------------------------------------------
    def observe(self, version, score: float) -> None:
        n = self.watch.setdefault(str(version), [0, 0.0])
        n[0], n[1] = n[0] + 1, n[1] + float(score)

    def mean(self, version) -> tuple[int, float | None]:
        n, s = self.watch.get(str(version), [0, 0.0])
        return n, (s / n if n else None)

    def fallen(self, version: int, previous: int) -> str | None:
        """Why ``version`` should be rolled back to ``previous`` by its live feedback, or None."""
        n, m = self.mean(version)
        n0, m0 = self.mean(previous)
        need = self.spec.rollback_min_feedback
        if n >= need and n0 >= need and m < m0 - self.spec.rollback_margin:
            return (f"live feedback fell: mean score {m:.3f} over {n} since it serves, {m0:.3f} over {n0} while "
                    f"version {previous} served (margin {self.spec.rollback_margin})")
        return None

    def status(self) -> dict:
        c = self.current
        return {"candidate": None if c is None else {"version": c["version"], "since": c["t"], "figures": c["figures"],
                                                      "shadow": self.verdict()[2]},
                "last_decision": self.last, "decisions": dict(self.decided),
                "live_feedback": {v: {"count": n, "mean_score": round(s / n, 4)} for v, (n, s) in self.watch.items() if n}}

    def state(self) -> dict:
        return {"candidates": {"current": self.current, "last": self.last, "decided": self.decided, "watch": self.watch}}

    def restore(self, snap: dict) -> None:
        from proxray.routing.registry import load_router

        c = snap.get("candidates")
        if not c:
            return
        self.current, self.last, self.decided, self.watch = c["current"], c["last"], c["decided"], c["watch"]
        self.router = load_router(self.current["path"]) if self.current else None
