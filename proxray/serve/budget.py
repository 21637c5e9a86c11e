"""Serving to a budget: instead of a fixed λ the app keeps the mean *estimated* cost of its recent routed
requests at ``budget.cost_per_query`` by adjusting λ online (per router replica).

After each request routed with the controller's λ, the recent mean cost m is an exponentially weighted
mean over about ``window`` requests of the chosen model's estimated cost, and λ moves in log space,
``log λ += gain · log(m / target)``: spending too much raises λ (cheaper models), too little lowers it.
Mean cost falls monotonically as λ grows, so this settles where the recent mean meets the target. A
request that sets its own ``proxray.lam`` uses it and is not counted.
"""
from __future__ import annotations

import math


class BudgetController:
    def __init__(self, cost_per_query: float, lam0: float | None = None, window: int = 100, gain: float = 0.05,
                 lam_max: float = 1e12):
        if not (cost_per_query > 0 and math.isfinite(cost_per_query)):
            raise ValueError(f"budget.cost_per_query={cost_per_query!r}: must be a finite number > 0")
        self.target = float(cost_per_query)
        # start where an accuracy difference of 0.1 is worth the whole budget, unless told otherwise
        self.lam = float(lam0) if lam0 else 0.1 / self.target
        self.alpha, self.gain, self.lam_max = 1.0 / max(window, 1), gain, lam_max
        self.lam_min = 1e-6 / self.target
        self.recent = None  # EWMA of the chosen models' estimated cost
        self.n = 0

    def observe(self, cost: float) -> None:
        """The estimated cost of the model chosen for one request routed with ``self.lam``."""
        cost = max(float(cost), 0.0)
        self.recent = cost if self.recent is None else (1 - self.alpha) * self.recent + self.alpha * cost
        self.n += 1
        ratio = max(self.recent, 1e-3 * self.target) / self.target
        self.lam = min(max(self.lam * ratio ** self.gain, self.lam_min), self.lam_max)

    def report(self) -> dict:
        return {"cost_per_query": self.target, "recent_mean_cost": self.recent, "requests": self.n}
