"""The evidence behind one routing decision. A ProxRouter's estimate is a weighted vote of known queries:
U_hat_m(x) = Σ_i w_i(x) V_i,m, so the evidence is the reference elements with the most weight (kNN: training
queries, with their id and task; KMeans: clusters, with their size, spread, prior and main tasks), what they estimate
for every model, each candidate's objective acc − λ·cost, the winner's margin over the runner-up, and the query's
outlier score against the router's own threshold. ``evidence`` is bounded: at most ``top`` elements (``MAX_TOP``),
numbers rounded, no text of any query.
"""
from __future__ import annotations

import numpy as np

from proxray.routing.objective import objective

MAX_TOP = 20


def _num(v: float, digits: int = 6) -> float:
    return float(round(float(v), digits))


def _elements(router, nb, w: np.ndarray, top: int) -> tuple[str, list, float]:
    """The ``top`` reference elements by weight (kNN neighbours or KMeans clusters), and their share of the weight."""
    ids, tasks = getattr(router, "query_ids_", None), getattr(router, "tasks_", None)
    order = np.argsort(-w, kind="stable")[:top]
    order = order[np.isfinite(nb.phi[0][order])]
    share = _num(w[order].sum())
    if nb.ref is not None:  # kNN: the neighbours, training queries
        out = []
        for j in order:
            row = int(nb.ref[0][j])
            out.append({"row": row, "query_id": None if ids is None else str(ids[row]),
                        "task": None if tasks is None else str(tasks[row]),
                        "distance": _num(nb.phi[0][j]), "weight": _num(w[j])})
        return "neighbours", out, share
    out = []
    main_tasks = _cluster_tasks(router) if tasks is not None and len(tasks) == len(router.labels_) else None
    for i in order:  # KMeans: clusters
        item = {"cluster": int(i), "size": int(router.sizes_[i]), "spread": _num(router.spreads_[i]),
                "prior": _num(router.prior_[i]), "distance": _num(nb.phi[0][i]), "weight": _num(w[i])}
        if main_tasks is not None:
            item["tasks"] = main_tasks[i]
        out.append(item)
    return "clusters", out, share


def _cluster_tasks(router, most: int = 3) -> list:
    """Per cluster, its ``most`` commonest tasks and their counts; computed once per assignment (kept)."""
    def compute():
        names, codes = np.unique(router.tasks_, return_inverse=True)
        K = len(router.centers_)
        counts = np.bincount(router.labels_ * len(names) + codes, minlength=K * len(names)).reshape(K, len(names))
        top = np.argsort(-counts, axis=1, kind="stable")[:, :most]
        return [{str(names[j]): int(counts[i, j]) for j in top[i] if counts[i, j]} for i in range(K)]

    return router._kept("_tasks_memo", (router.labels_, router.tasks_), compute)


def evidence(router, X, lam: float = 0.0, candidates=None, top: int = 10, visible=None) -> dict:
    """The evidence for one query's embedding ``X`` (d,) or (1, d) at ``lam``. ``candidates``: the plan's models in
    the order it would try them (the winner first; default: every model by objective); ``visible``: the models the
    asker may see (an API key's own; default: all). Returns a JSON-able dict."""
    if not 1 <= int(top) <= MAX_TOP:
        raise ValueError(f"top={top!r}: must be between 1 and {MAX_TOP}")
    X = np.asarray(X, dtype=np.float32).reshape(1, -1)
    nb = router.neighbourhood(X)
    w = router.temperature_.weights(nb.phi, nb.prior, router)
    acc, cost = router.estimate_at(w, nb)
    acc, cost = acc[0], cost[0]
    obj = objective(acc[None, :], cost[None, :], np.array([float(lam)]))[0]
    models = list(router.models_)
    if candidates is None:
        candidates = [models[i] for i in np.argsort(-obj, kind="stable")]
    kind, elements, share = _elements(router, nb, w[0], int(top))
    score = float(nb.phi[0].min())
    threshold = getattr(router, "outlier_threshold_", None)
    at = {m: models.index(m) for m in candidates}
    winner = candidates[0]
    runner_up = candidates[1] if len(candidates) > 1 else None
    return {
        "kind": kind, "elements": elements, "shown": len(elements), "of": int(np.isfinite(nb.phi[0]).sum()),
        "weight_shown": share,
        "temperature": router.temperature_.spec, "lam": float(lam),
        "models": [{"model": m, "accuracy": _num(acc[i]), "cost": _num(cost[i], 10), "objective": _num(obj[i], 8),
                    "candidate": m in at} for i, m in sorted(enumerate(models), key=lambda im: -obj[im[0]])
                   if visible is None or m in visible],
        "winner": winner, "runner_up": runner_up,
        "margin": None if runner_up is None else _num(obj[at[winner]] - obj[at[runner_up]], 8),
        "outlier_score": _num(score), "outlier_threshold": None if threshold is None else _num(threshold),
        "outlier": None if threshold is None else bool(score > threshold),
    }


def format_evidence(ev: dict) -> str:
    """The evidence as tables a person reads (``proxray explain``)."""
    lines = [f"routed to {ev['winner']}" + (f" (runner-up {ev['runner_up']}, margin {ev['margin']:+.4g} in "
                                             f"acc − λ·cost, λ = {ev['lam']:g})" if ev["runner_up"] else ""),
             f"outlier score {ev['outlier_score']:.4f}" + (
                 "" if ev["outlier"] is None else f" ({'an outlier' if ev['outlier'] else 'an inlier'}: threshold "
                                                  f"{ev['outlier_threshold']:.4f})"),
             "", f"{'model':40s} {'accuracy':>9s} {'cost (USD)':>12s} {'objective':>11s}"]
    for m in ev["models"]:
        lines.append(f"{m['model'][:40]:40s} {m['accuracy']:9.3f} {m['cost']:12.4g} {m['objective']:11.4g}"
                     + ("" if m["candidate"] else "  (not a candidate)"))
    lines += ["", f"the {ev['shown']} {ev['kind']} with the most weight of {ev['of']} ({100 * ev['weight_shown']:.1f} % "
                  f"of it; temperature {ev['temperature']})"]
    if ev["kind"] == "neighbours":
        lines.append(f"{'weight':>8s} {'distance':>9s}  {'task':20s} query_id")
        for e in ev["elements"]:
            lines.append(f"{e['weight']:8.4f} {e['distance']:9.4f}  {str(e['task'] or '-')[:20]:20s} "
                         f"{e['query_id'] or e['row']}")
    else:
        lines.append(f"{'weight':>8s} {'distance':>9s} {'size':>7s} {'spread':>8s}  cluster, main tasks")
        for e in ev["elements"]:
            tasks = ", ".join(f"{t} {c}" for t, c in (e.get("tasks") or {}).items())
            lines.append(f"{e['weight']:8.4f} {e['distance']:9.4f} {e['size']:7d} {e['spread']:8.4f}  "
                         f"{e['cluster']}{': ' + tasks if tasks else ''}")
    return "\n".join(lines)
