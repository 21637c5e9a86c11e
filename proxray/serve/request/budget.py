"""Serving to a budget: instead of a fixed λ the app keeps the mean cost of its recent routed requests at
``budget.cost_per_query`` by adjusting λ online (per router replica).

What is counted is ``budget.basis``: ``estimated`` — the router's estimated cost of the chosen model, known
when the request is routed; ``realised`` — the answer's usage tokens at the answering model's price, known
when the answer is complete. They differ where the router's estimates are wrong, which is on queries unlike
its training queries (docs/guides/budgets.md); an answer without usage counts its estimate and is
reported as ``unmetered``.

After each request routed with the controller's λ, the recent mean cost m is an exponentially weighted
mean over about ``window`` requests of the counted cost, and λ moves in log space,
``log λ += gain · log(m / target)``: spending too much raises λ (cheaper models), too little lowers it.
Mean cost falls monotonically as λ grows, so this settles where the recent mean meets the target. A
request that sets its own ``proxray.lam`` uses it and is not counted.

Each API key of the keys file has a controller of its own (``of``): a key's requests move its own λ, and its answers
report its own controller, never another key's; requests without such a key share the app's.
"""
from __future__ import annotations

import math

from proxray.common.pricing import answer_cost


class BudgetController:
    def __init__(self, cost_per_query: float, lam0: float | None = None, window: int = 100, gain: float = 0.05,
                 lam_max: float = 1e12, basis: str = "estimated", prices: dict | None = None):
        if not (cost_per_query > 0 and math.isfinite(cost_per_query)):
            raise ValueError(f"budget.cost_per_query={cost_per_query!r}: must be a finite number > 0")
        self.target = float(cost_per_query)
        self.settings = dict(cost_per_query=cost_per_query, lam0=lam0, window=window, gain=gain, lam_max=lam_max,
                             basis=basis, prices=prices)
        self.keys: dict = {}  # key name -> its own controller (``of``)
        # start where an accuracy difference of 0.1 is worth the whole budget, unless told otherwise
        self.lam = float(lam0) if lam0 else 0.1 / self.target
        self.alpha, self.gain, self.lam_max = 1.0 / max(window, 1), gain, lam_max
        self.lam_min = 1e-6 / self.target
        if basis not in ("estimated", "realised"):
            raise ValueError(f"budget.basis={basis!r}: one of 'estimated', 'realised'")
        self.basis = basis
        self.prices = prices or {}  # model -> pool.spec.PriceSpec, for ``answered`` (AppArgs requires them all)
        self.recent = None  # EWMA of the counted cost
        self.n = self.unmetered = 0

    def of(self, key: str | None) -> "BudgetController":
        """The controller of API key ``key`` (a name from the keys file: a bounded set), made on its first request
        with this one's settings; this one for requests without a key."""
        if key is None:
            return self
        if key not in self.keys:
            self.keys[key] = BudgetController(**self.settings)
        return self.keys[key]

    def observe(self, cost: float, metered: bool = True) -> None:
        """The cost of one request routed with ``self.lam`` (on the controller's basis; ``metered=False``:
        an estimate standing in for a realised cost that could not be measured)."""
        cost = max(float(cost), 0.0)
        self.unmetered += not metered
        self.recent = cost if self.recent is None else (1 - self.alpha) * self.recent + self.alpha * cost
        self.n += 1
        ratio = max(self.recent, 1e-3 * self.target) / self.target
        self.lam = min(max(self.lam * ratio ** self.gain, self.lam_min), self.lam_max)

    def answered(self, model: str, usage, estimate: float) -> None:
        """On realised cost, one complete answer: its ``usage`` tokens at ``model``'s price, or where it carries
        no usage (``None``: a stream whose client did not ask for it) its ``estimate``, counted as unmetered."""
        usd, metered = answer_cost(self.prices.get(model), usage, estimate)
        self.observe(usd, metered=metered)

    def report(self) -> dict:
        out = {"cost_per_query": self.target, "basis": self.basis, "recent_mean_cost": self.recent, "requests": self.n}
        if self.basis == "realised":
            out["unmetered"] = self.unmetered
        return out
