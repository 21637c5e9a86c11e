"""The gate a router version passes before it serves: a candidate (labelled queries added, a model added) is scored
against the served version by one objective, the mean *realised* utility acc − λ·cost of the model each router
chooses (``proxray.routing.objective.choose``, at the monitor's λ), on two sets of queries, each by a protocol that
never scores a query with a router that saw its label:

* **the training queries** (what the router already did well): a seeded sample of the table's queries, each estimated
  by both routers with itself left out (kNN: its k nearest *other* references; KMeans: its cluster's mean without its
  own labels) — ``loo_estimate``;
* **the new labels** (what the candidate learned): K folds of the batch; each fold is estimated by the served version
  plus the other folds (a router that never saw that fold), beside the served version itself — ``held_out``.

Rule (``decide``): reject when the candidate is worse than ``train_tolerance`` on the training queries, or worse than
``new_tolerance`` on the new labels, *beyond noise*: the mean paired difference Δ with its standard error SE, rejected
where even its one-sided 95 % upper bound Δ + 1.645·SE falls under −tolerance (with a single query, or differences all
alike, SE is none or 0 and Δ decides alone). One training query of 270 routed worse is −0.0037; a 5-label feedback
batch moves by 0.2 a query, so a point estimate would reject half of the batches that help on a coin flip, and their
labels with them; what passes on thin evidence still meets the shadow window and the live-feedback rollback. Labels
that lie agree with a candidate fitted on them: this gate cannot see poison; the label sources' spot checks
(``proxray.monitor.sources``) do.
"""
from __future__ import annotations

import numpy as np

from proxray.routing.objective import choose


def realised(acc_hat, cost_hat, acc, cost, lam: float) -> np.ndarray:
    """acc − λ·cost (q,) of the model chosen from the estimates, under the labels ``acc``/``cost`` (q, M)."""
    pick = choose(acc_hat, cost_hat, lam)
    rows = np.arange(len(acc))
    return acc[rows, pick] - lam * cost[rows, pick]


def compare(served: np.ndarray, candidate: np.ndarray) -> dict:
    """Mean utility of each and their paired difference with its standard error (how wide the evidence is)."""
    d = candidate - served
    se = float(np.std(d, ddof=1) / np.sqrt(len(d))) if len(d) > 1 else None
    return {"n": int(len(d)), "served": round(float(np.mean(served)), 5), "candidate": round(float(np.mean(candidate)), 5),
            "delta": round(float(np.mean(d)), 5), "se": None if se is None else round(se, 5)}


def loo_estimate(router, X, rows, acc, cost):
    """Estimates (acc_hat, cost_hat) of training queries ``X`` — rows ``rows`` of ``router``'s training queries, with
    labels ``acc``/``cost`` (columns the router's models) — each with its own labels left out."""
    from proxray.routing.index import as_matrix, prepare

    R = prepare(as_matrix(X, dim=router.dim_), router.metric)
    return router.leave_out_estimate(R, np.asarray(rows), acc, cost)


def on_training(served, candidate, X, rows, acc, cost, lam: float) -> dict:
    """Both routers on the training sample, each query left out; ``acc``/``cost`` the candidate's columns (the served
    router's models first: a model added is the last column), the served router choosing among its own."""
    M = len(served.models_)
    a_s, c_s = loo_estimate(served, X, rows, acc[:, :M], cost[:, :M])
    a_c, c_c = loo_estimate(candidate, X, rows, acc, cost)
    return compare(realised(a_s, c_s, acc[:, :M], cost[:, :M], lam), realised(a_c, c_c, acc, cost, lam))


def held_out(served, grow, X, acc, cost, lam: float, folds: int, seed: int = 0) -> dict:
    """The new labels in ``folds`` folds: each fold estimated by ``grow(mask)`` (the served version plus the batch's
    rows where ``mask``) and by the served version; realised utility under the new labels."""
    n = len(X)
    if n == 0:
        return {"n": 0, "folds": 0, "served": None, "candidate": None, "delta": None, "se": None}
    k = int(min(folds, n))
    part = np.random.default_rng(seed).permutation(n) % k
    a_c, c_c = np.zeros_like(acc), np.zeros_like(cost)
    for f in range(k):
        a_c[part == f], c_c[part == f] = grow(part != f).estimate(X[part == f])
    a_s, c_s = served.estimate(X)
    return {**compare(realised(a_s, c_s, acc, cost, lam), realised(a_c, c_c, acc, cost, lam)), "folds": k}


Z_ONE_SIDED_95 = 1.645  # Δ + Z·SE: the upper end of a one-sided 95 % interval of the mean paired difference


def upper_bound(f: dict) -> float:
    """Δ + Z·SE of one part's figures (Δ alone where SE is none: a single query)."""
    return f["delta"] + Z_ONE_SIDED_95 * (f.get("se") or 0.0)


def decide(figures: dict, spec) -> tuple[bool, str]:
    """(promote?, why) from the two parts' figures under the gate's tolerances (``GateSpec``): rejected where a part
    is worse than its tolerance beyond noise (:func:`upper_bound` under −tolerance)."""
    train, new = figures.get("train"), figures.get("new")
    for f, tol, what in ((train, spec.train_tolerance, "the training queries worse"),
                         (new, spec.new_tolerance, "the new labels worse held out")):
        if f and f.get("delta") is not None and upper_bound(f) < -tol:
            return False, (f"it routes {what}: utility {f['candidate']:.4f} vs {f['served']:.4f} served "
                           f"(Δ {f['delta']:+.4f}, SE {f.get('se') or 0:.4f}: Δ + {Z_ONE_SIDED_95}·SE "
                           f"{upper_bound(f):+.4f} < −{tol})")
    parts = [f"{name} Δ {f['delta']:+.4f} (SE {f.get('se') or 0:.4f})" for name, f in
             (("training", train), ("new labels", new)) if f and f.get("delta") is not None]
    return True, "held-out evidence not worse beyond tolerance and noise (" + ", ".join(parts) + ")"


class TrainingSample:
    """The training queries the gate scores (and the judge's canaries come from): a seeded sample of at most ``n`` of
    the table's queries — ``rows`` their places in the router's training order, ``X`` their embeddings,
    ``acc``/``cost`` their labels (the table's, columns the router's models)."""

    def __init__(self, X, acc, cost, n: int, seed: int = 0):
        total = len(X)
        self.rows = np.sort(np.random.default_rng(seed).permutation(total)[: min(n, total)])
        self.X, self.acc, self.cost = np.asarray(X)[self.rows], np.asarray(acc)[self.rows], np.asarray(cost)[self.rows]

    def with_models(self, parts, models: list):
        """(acc, cost) of the sample with a column per added model from a growth evaluation's rows ``parts`` (query ids
        ``train-<row>``)."""
        parts = parts.drop_duplicates(["model", "query_id"], keep="last")
        ids = [f"train-{r}" for r in self.rows]
        cols = [parts[parts["model"] == m].set_index("query_id").loc[ids] for m in models]
        acc = np.hstack([self.acc] + [c["correct"].to_numpy(float)[:, None] for c in cols])
        cost = np.hstack([self.cost] + [c["cost"].fillna(0).to_numpy(float)[:, None] for c in cols])
        return acc, cost
