"""The paper's experimental protocols (§4, appendix H) as one function and one command each.

* ``leave-task-out``: inlier queries split 60/40 (per task, seeded); Base and Prox fit on the inlier
  60 %; AllSee fits on that plus 60 % of each outlier task; everything is tested on the inlier 40 %
  plus the outlier 40 % AllSee never saw.
* ``few-shot-outlier``: the same, plus ``few_shot`` outlier queries (from the outliers' 60 % part)
  in Base's and Prox's training set.

Reported per split (outlier, inlier, overall): normalized AUC (%) of Base, Prox, AllSee and of the
Random, Largest and Oracle baselines — or, for a table without cost, mean accuracy (%) at λ = 0 —
as mean and standard deviation over seeds. ``report`` writes a result as the paper's table, ``plots`` draws its
curves; ``proxray eval`` (``proxray.cli``) runs it on a table.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from proxray.common.logs import log
from proxray.experiments.metrics import baseline_points, cost_range, ndch_auc, routing_score, sweep
from proxray.routing.registry import DEFAULT_ROUTER, make_router
from proxray.routing.temperature import Temperature

PROTOCOLS = ("leave-task-out", "few-shot-outlier")
SPLITS = ("outlier", "inlier", "overall")
ROUTER_KEYS = ("base", "prox", "allsee")
BASELINE_KEYS = ("random", "largest", "oracle")
LABELS = {"base": "Base", "prox": "Prox", "allsee": "AllSee"}


@dataclass
class Split:
    base_train: np.ndarray   # indices Base and Prox learn from
    allsee_train: np.ndarray  # indices AllSee learns from
    test: np.ndarray         # indices everything is tested on
    test_outlier: np.ndarray  # bool mask over ``test``


def protocol_split(tasks, outliers, protocol: str, seed: int, few_shot: int = 25, train_frac: float = 0.6) -> Split:
    """Index sets of one protocol run (see the module docstring)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r}: allowed values are {', '.join(PROTOCOLS)}")
    tasks = np.asarray(tasks)
    unknown = sorted(set(outliers) - set(tasks))
    if unknown:
        raise ValueError(f"outlier task(s) {unknown} are not in the table (tasks: {sorted(set(tasks))})")
    if set(outliers) == set(tasks):
        raise ValueError("every task is an outlier: at least one inlier task is needed")
    rng = np.random.default_rng(seed)
    in_tr, in_te, out_seen, out_te = [], [], [], []
    for t in sorted(set(tasks)):
        idx = rng.permutation(np.flatnonzero(tasks == t))
        cut = int(round(train_frac * len(idx)))
        if t in outliers:
            out_seen.append(idx[:cut])
            out_te.append(idx[cut:])
        else:
            in_tr.append(idx[:cut])
            in_te.append(idx[cut:])
    in_tr, in_te = np.concatenate(in_tr), np.concatenate(in_te)
    out_seen, out_te = np.concatenate(out_seen), np.concatenate(out_te)
    base_train = in_tr
    if protocol == "few-shot-outlier":
        shots = rng.choice(out_seen, size=min(few_shot, len(out_seen)), replace=False)
        base_train = np.concatenate([in_tr, shots])
    test = np.concatenate([in_te, out_te])
    return Split(np.sort(base_train), np.sort(np.concatenate([in_tr, out_seen])), test,
                 np.concatenate([np.zeros(len(in_te), bool), np.ones(len(out_te), bool)]))


def baseline_scores(acc, cost, largest: int) -> dict:
    if cost is None:
        return {"random": 100 * float(acc.mean()), "largest": 100 * float(acc[:, largest].mean()),
                "oracle": 100 * float(acc.max(1).mean())}
    b = baseline_points(acc, cost, largest)
    c = cost_range(acc, cost)
    return {k: ndch_auc(b[k], *c) for k in BASELINE_KEYS}


def budget_scores(fitted: dict, X_cal, Xt, at, ct, budgets, test_outlier) -> list:
    """At each budget (USD per query): per router the λ calibrated on its training queries
    (``router.calibrate``), and the accuracy (%) and mean cost it really reaches on the test queries — on all
    of them, and apart on the inlier and the outlier ones (``test_outlier`` (q,) bool: where a budget calibrated
    on the training tasks breaks); and the best single model that costs no more on the test queries than the
    router spent."""
    rows, out = np.arange(len(Xt)), []
    parts = {"inlier": ~test_outlier, "outlier": test_outlier}
    single_acc, single_cost = at.mean(0), ct.mean(0)
    for b in budgets:
        entry = {"budget": float(b)}
        for name, r in fitted.items():
            try:
                lam = r.calibrate(X_cal[name], target_cost=b)
            except ValueError:  # below what the cheapest routing spends on the training queries
                entry[name] = None
                continue
            pick = r.route(Xt, lam=lam)
            paid = ct[rows, pick]
            spent = float(paid.mean())
            affordable = single_acc[single_cost <= spent]
            entry[name] = {"lam": float(lam), "accuracy": 100 * float(at[rows, pick].mean()), "cost": spent,
                           **{f"cost_{part}": float(paid[m].mean()) if m.any() else None for part, m in parts.items()},
                           "best_single": 100 * float(affordable.max()) if len(affordable) else None}
        out.append(entry)
    return out


def run_once(X, acc, cost, tasks, router: str, protocol: str, outliers, seed: int, few_shot: int = 25,
             n_clusters: int | None = None, k: int | None = None, temperature="auto",
             keep_curves: bool = False, budgets=()) -> dict:
    """One seed of one protocol: {"scores": {split: {key: value}}, "temperature": Prox's, as its spec, "curves": …,
    "budgets": [per budget: per router λ, accuracy and cost reached on the test split]}.
    ``temperature``: anything the routers take ("auto": the router's shipped one), or a callable
    ``(X, acc, cost, tasks, router, hp, protocol=, few_shot=, seed=) -> Temperature`` that chooses it from the
    training split alone (how research/tau plugs in the rules it studies). ``n_clusters`` / ``k``: the family's own
    where None (``routing.registry``)."""
    sp = protocol_split(tasks, outliers, protocol, seed, few_shot)
    hp = {"random_state": seed, **{name: v for name, v in (("n_clusters", n_clusters), ("k", k)) if v is not None}}
    if callable(temperature) and not isinstance(temperature, Temperature):
        tr = sp.base_train
        temperature = temperature(X[tr], acc[tr], None if cost is None else cost[tr], tasks[tr], router, hp,
                                  protocol=protocol, few_shot=few_shot, seed=seed)
    c_tr = (lambda idx: None if cost is None else cost[idx])
    fitted = {
        "base": make_router(router, "base", hp).fit(X[sp.base_train], acc[sp.base_train], c_tr(sp.base_train)),
        "prox": make_router(router, "prox", hp, temperature).fit(X[sp.base_train], acc[sp.base_train], c_tr(sp.base_train)),
        "allsee": make_router(router, "base", hp).fit(X[sp.allsee_train], acc[sp.allsee_train], c_tr(sp.allsee_train)),
    }
    Xt, at, ct = X[sp.test], acc[sp.test], c_tr(sp.test)
    estimates = {name: r.estimate(Xt) for name, r in fitted.items()}
    tr_cost = acc[sp.base_train] if cost is None else cost[sp.base_train]
    largest = int(np.argmax(tr_cost.mean(0)))  # most expensive on training data (most accurate without cost)
    masks = {"outlier": sp.test_outlier, "inlier": ~sp.test_outlier, "overall": np.ones(len(sp.test), bool)}
    scores, curves = {}, {}
    for split, m in masks.items():
        a, c = at[m], None if ct is None else ct[m]
        s = {name: routing_score(e[0][m], e[1][m], a, c) for name, e in estimates.items()}
        s.update(baseline_scores(a, c, largest))
        scores[split] = s
        if keep_curves and c is not None:
            curves[split] = {name: sweep(e[0][m], e[1][m], a, c)[2] for name, e in estimates.items()}
            curves[split].update(baseline_points(a, c, largest))  # the single models' points drawn too
    budget = []
    if budgets and cost is not None:
        cal = {"base": X[sp.base_train], "prox": X[sp.base_train], "allsee": X[sp.allsee_train]}
        budget = budget_scores(fitted, cal, Xt, at, ct, budgets, sp.test_outlier)
    return {"scores": scores, "temperature": fitted["prox"].temperature_.spec, "curves": curves, "budgets": budget}


def _mean_budgets(runs) -> list:
    """Budget results averaged over seeds (a router that could not meet a budget in some seed: None)."""
    out = []
    for i, first in enumerate(runs[0]["budgets"]):
        entry = {"budget": first["budget"]}
        for name in ROUTER_KEYS:
            got = [r["budgets"][i][name] for r in runs]
            if any(g is None for g in got):
                entry[name] = None
                continue
            entry[name] = {key: (None if any(g[key] is None for g in got) else float(np.mean([g[key] for g in got])))
                           for key in got[0]}
        out.append(entry)
    return out


def evaluate(X, acc, cost, tasks, router=DEFAULT_ROUTER, protocol="leave-task-out", outliers=(), seeds=(42, 7, 99),
             few_shot=25, n_clusters=None, k=None, temperature="auto",
             keep_curves=False, budgets=()) -> dict:
    """All seeds; the result has the JSON shape of ``proxray eval --json`` ("temperature": Prox's spec per seed)."""
    runs = []
    for s in seeds:
        log(f"seed {s}: {router} / {protocol} / outliers {', '.join(outliers)}")
        runs.append(run_once(X, acc, cost, np.asarray(tasks), router, protocol, list(outliers), s, few_shot,
                             n_clusters, k, temperature, keep_curves=keep_curves and not runs, budgets=budgets))
    keys = ROUTER_KEYS + BASELINE_KEYS
    mean = {sp: {key: float(np.mean([r["scores"][sp][key] for r in runs])) for key in keys} for sp in SPLITS}
    std = {sp: {key: float(np.std([r["scores"][sp][key] for r in runs])) for key in keys} for sp in SPLITS}
    return {"router": router, "protocol": protocol, "outliers": list(outliers),
            "temperature": [r["temperature"] for r in runs], "metric": "auc" if cost is not None else "accuracy",
            "seeds": list(seeds), "splits": mean, "std": std, "budgets": _mean_budgets(runs),
            "_curves": runs[0]["curves"]}
