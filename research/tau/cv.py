"""Choosing 1/tau from training data alone by cross-validation: the τ study's rules (not shipped; proxray's
``--temperature auto`` needs no CV, ``proxray.routing.temperature``).

The paper tunes tau by hand on held-out data. Here it is chosen by leave-one-training-task-out
cross-validation, which mimics the deployment question "how well do we route a task we have not
seen?" without ever looking at the test split or the outlier tasks:

for each training task t (in turn playing the outlier):
    fit Prox on 80 % of the other training tasks (plus ``few_shot`` queries of t in the few-shot
    protocol), score routing on the rest of t (outlier score) and on the held-out 20 % of the other
    tasks (inlier score), for every 1/tau of the grid;
average (outlier score + inlier score) / 2 over the folds, smooth that curve over grid neighbours, take its
argmax and move one grid step toward the Base limit (rule "shifted", ``DEFAULT_RULE``: the training CV's best
1/tau sits further from Base than the test split's, research/tau-study.md: How τ is chosen; the other rules of
``select_inv_tau`` are options). KMeans' auto (rule "ess-or-shifted", ``select_ess_or_shifted``) scores one more
setting in the same folds, the adaptive bandwidth ``ess:ESS_TARGET`` (per query the 1/tau at which the weights'
effective sample size is 3 clusters), and takes it over shifted's pick when its CV mean is more than ``ESS_MARGIN``
pp higher; rule "ess-or-capped" (KMeans' default until the plug-in below) does the same, except that shifted's step
stops at the paper's 1/tau = ``SHIFT_CAP`` (20) where the smoothed CV's top is at or below it and gains at least
``SHIFT_CAP_GAIN`` pp on Base there (the step from 20 to 50 overshot on BBH; docs/prereg-km-cap20-ess-first.md).

The folds are repeated over ``CV_REPEATS`` random 80/20 splits (and task orders) and averaged: one pass's
curve is too noisy near its top to rank the best few 1/tau (research/tau-study.md: How τ is chosen).

The grid contains the Base limit itself (inf for KMeans, 0 for kNN), so when tilting does not help
on the training tasks, auto falls back to the Base router. Fitting is done once per fold: the
weights are computed at estimate time, so every 1/tau reuses the same fitted reference set.

kNN's auto reads no CV (rule "spread", ``DEFAULT_RULES``): a per-query temperature,
1/tau(x) = ``SPREAD_INV_TAU`` / std(phi(x)) over the query's k neighbours (the routers' ``temperature="spread"``),
ahead of every fixed 1/tau and of the CV rules on six sets of configurations (research/tau-study.md: How τ is chosen).
KMeans' auto reads no CV either now (rule "plug-in"): per query the 1/tau minimizing the paper's bias–variance bound
with its variance and Lipschitz terms read off the fitted clusters (the routers' ``temperature="bv"`` at
``BV_WEIGHT``, ``weights.bias_variance_inv_tau``), adopted by a test pre-registered in docs/prereg-km-plugin.md.
``auto_choice`` resolves auto for either router.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels import check_ess_target, ess_inv_tau, tilted_weights
from proxray.experiments.metrics import routing_score
from proxray.routing import registry
from proxray.routing.temperature import Temperature, legacy
from proxray.routing.weights import proximity_weights

CV_REPEATS = 3  # auto's CV averages its folds over 3 random splits (research/tau-study.md: How τ is chosen)
GRID = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, float("inf"))


@dataclass(frozen=True)
class ESS(Temperature):
    """The adaptive bandwidth the study measured: per query the 1/tau at which the weights' Kish effective sample
    size is ``target`` (``kernels.ess_inv_tau``). A ``Temperature``: routers take it like the shipped ones."""
    target: float = 3.0
    kind = "ess"

    def __post_init__(self):
        object.__setattr__(self, "target", check_ess_target(self.target))

    @property
    def value(self) -> float:
        return self.target

    def weights(self, phi, prior, router) -> np.ndarray:
        return proximity_weights(np.asarray(phi) * ess_inv_tau(phi, prior, self.target)[:, None], 1.0, prior)


def as_temperature(inv_tau, temperature: str = "fixed") -> Temperature:
    """The study's (number, temperature name) pair as a router temperature: "ess" is ``ESS``, the rest the shipped
    kinds (``temperature.legacy``: fixed 1/tau, spread c, bv = plug-in c)."""
    return ESS(float(inv_tau)) if temperature == "ess" else legacy(inv_tau, None, temperature)


def make_router(kind: str, weighting: str, hp: dict, inv_tau: float = 20.0, n_train: int | None = None,
                temperature: str = "fixed"):
    """``registry.make_router`` with the study's (inv_tau, temperature name) spelling."""
    return registry.make_router(kind, weighting, hp, as_temperature(inv_tau, temperature), n_train)


def chooser(rule: str | None = None, repeats: int = None):
    """A temperature rule for ``proxray.experiments.protocols.run_once(temperature=...)``: per seed, ``auto_choice``
    with ``rule`` on the training split alone."""
    def choose(X, acc, cost, tasks, router, hp, protocol="leave-task-out", few_shot=25, seed=42):
        got = auto_choice(X, acc, cost, tasks, router, hp, protocol=protocol, few_shot=few_shot, seed=seed,
                          rule=rule, repeats=CV_REPEATS if repeats is None else repeats)
        return as_temperature(got.inv_tau, got.temperature)
    return choose


def brier_score(acc_hat, acc) -> float:
    """Minus the mean squared error (in %², higher is better) of the accuracy estimates against the observed
    correctness: a smooth, per-query criterion, unlike the hull-based AUC."""
    return -100.0 * float(np.mean((np.asarray(acc_hat, float) - np.asarray(acc, float)) ** 2))


@dataclass(frozen=True)
class CVFolds:
    """Per-fold CV scores: ``out`` and ``inl`` (F, G) — fold f's outlier and inlier score at grid setting g —
    and ``groups``, the training tasks each fold held out (F tuples). ``curves()`` is what ``cv_curves``
    returns (the means over folds); ``by_task()`` averages each task's folds over the repeats."""
    out: np.ndarray
    inl: np.ndarray
    groups: tuple

    def curves(self):
        return self.out.mean(axis=0), self.inl.mean(axis=0)

    def by_task(self):
        """(T, G) mean of (outlier + inlier) / 2 per held-out task group (its folds over the repeats averaged):
        the units a task-level standard error is taken over (``select_inv_tau(rule="lcb")``)."""
        keys = sorted(set(self.groups))
        m = (self.out + self.inl) / 2
        return np.stack([m[[g == k for g in self.groups]].mean(axis=0) for k in keys])


def cv_curves(X, acc, cost, tasks, router: str, hp: dict, protocol: str = "leave-task-out", few_shot: int = 25,
              seed: int = 42, grid=GRID, min_task_size: int = 10, score: str = "routing",
              fold_tasks: int = 1, repeats: int = 1):
    """Leave-training-tasks-out scores for every 1/tau of ``grid``: (outlier (G,), inlier (G,)),
    each the mean over folds, or None when fewer than two tasks are large enough to hold out
    (``cv_folds`` keeps the folds apart)."""
    folds = cv_folds(X, acc, cost, tasks, router, hp, protocol, few_shot, seed, grid, min_task_size, score,
                     fold_tasks, repeats)
    return None if folds is None else folds.curves()


def cv_folds(X, acc, cost, tasks, router: str, hp: dict, protocol: str = "leave-task-out", few_shot: int = 25,
             seed: int = 42, grid=GRID, min_task_size: int = 10, score: str = "routing",
             fold_tasks: int = 1, repeats: int = 1):
    """The folds of ``cv_curves``, kept apart (``CVFolds``), or None when fewer than two tasks are large
    enough to hold out.
    ``score``: "routing" (normalized AUC, ``routing_score``) or "brier" (``brier_score`` of the estimates).
    ``fold_tasks``: how many training tasks a fold holds out together (1: each task once, in name order;
    more: the tasks in random groups of about that size, at least two groups), and in the few-shot protocol
    the ``few_shot`` shots are drawn from the group's queries together, as ``protocol_split`` draws them from
    all outlier tasks; ``repeats``: that many random partitions (and 80/20 splits), their folds averaged."""
    if score not in ("routing", "brier"):
        raise ValueError(f"score={score!r}: allowed values are routing, brier")
    for name, v in (("fold_tasks", fold_tasks), ("repeats", repeats)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}={v!r}: allowed values are integers >= 1")
    tasks = np.asarray(tasks)
    names, counts = np.unique(tasks, return_counts=True)
    eligible = [t for t, c in zip(names, counts) if c >= min_task_size]
    if len(eligible) < 2:
        return None
    rng = np.random.default_rng([seed, 17])
    if fold_tasks == 1 and repeats == 1:
        folds = [[t] for t in eligible]  # the original leave-one-task-out order (and random stream)
    else:
        folds = [list(g) for _ in range(repeats)
                 for g in np.array_split(rng.permutation(eligible), max(2, len(eligible) // fold_tasks))]
    out_scores, in_scores = np.zeros((len(folds), len(grid))), np.zeros((len(folds), len(grid)))
    for f, group in enumerate(folds):
        in_group = np.isin(tasks, group)
        held = np.flatnonzero(in_group)
        rest = rng.permutation(np.flatnonzero(~in_group))
        cut = int(0.8 * len(rest))
        train, in_val, out_val = rest[:cut], rest[cut:], held
        if protocol == "few-shot-outlier" and few_shot > 0:
            held = rng.permutation(held)
            shots = held[: min(few_shot, len(held) // 2)]
            train, out_val = np.concatenate([train, shots]), held[len(shots):]
        fitted = make_router(router, "prox", hp, n_train=len(train)).fit(
            X[train], acc[train], None if cost is None else cost[train])
        for val, total in ((out_val, out_scores), (in_val, in_scores)):
            for g, (a_hat, c_hat) in enumerate(estimates_over(fitted, X[val], grid)):
                total[f, g] = (brier_score(a_hat, acc[val]) if score == "brier" else
                               routing_score(a_hat, c_hat, acc[val], None if cost is None else cost[val]))
    return CVFolds(out_scores, in_scores, tuple(tuple(sorted(str(t) for t in g)) for g in folds))


RELATIVE_FLOOR = 0.05  # distances below it count as it: an exact duplicate must not make 1/tau infinite


def estimates_over(fitted, X, settings):
    """The fitted Prox router's estimates for ``X`` at every temperature setting, from one search: a
    number is a fixed 1/tau; ``"rel:a"`` is a per-query 1/tau = a / max(phi_min(x), RELATIVE_FLOOR) — the
    nearer the query's nearest reference element, the sharper the tilt, and far queries are smoothed more
    (the paper's bias–variance argument); ``"spr:a"`` is 1/tau = a / std(phi(x)), the distances measured
    in units of their own spread over the query's reference set; ``"mix:a,b,..."`` averages the weights at
    the fixed 1/tau values a, b, ... (an ensemble over temperatures instead of one choice); ``"ess:E"`` is the
    per-query 1/tau at which the weights' effective sample size is E (``weights.ess_inv_tau``); ``"bv:c"`` (KMeans)
    is the per-query plug-in 1/tau of the bias–variance bound with bias weight c (``weights.bias_variance_inv_tau``;
    every "bv:" setting from one pass over its grid). Yields (acc_hat, cost_hat) per setting."""
    from proxray.routing.weights import bias_variance_weights

    nb = fitted.neighbourhood(X)
    phi, ref, prior = nb
    bv = [s for s in settings if isinstance(s, str) and s.startswith("bv:")]
    if bv:
        bv = dict(zip(bv, (w for _, w in bias_variance_weights(phi, prior, *fitted.bias_variance_stats(),
                                                                [float(s[3:]) for s in bv]))))
    nearest = np.maximum(np.where(np.isfinite(phi), phi, np.inf).min(axis=1), RELATIVE_FLOOR)
    for setting in settings:
        if isinstance(setting, str) and setting.startswith("rel:"):
            w = proximity_weights(phi / nearest[:, None], float(setting[4:]), prior)
        elif isinstance(setting, str) and setting.startswith("spr:"):  # the routers' temperature="spread"
            w = tilted_weights(phi, float(setting[4:]), prior, "spread")
        elif isinstance(setting, str) and setting.startswith("ess:"):  # the routers' temperature="ess"
            w = tilted_weights(phi, float(setting[4:]), prior, "ess")
        elif isinstance(setting, str) and setting.startswith("bv:"):  # the routers' temperature="bv"
            w = bv[setting]
        elif isinstance(setting, str) and setting.startswith("mix:"):
            taus = [float(v) for v in setting[4:].split(",")]
            w = sum(proximity_weights(phi, t, prior) for t in taus) / len(taus)
        else:
            w = proximity_weights(phi, float(setting), prior)
        yield fitted.estimate_at(w, nb)


NEAR_BASE_TOL = 1.0  # pp: the "near-base" rule's tolerance (research/tau-study.md: How τ is chosen)
SE_MULT = 1.0  # the "lcb" and "one-se" rules: how many task-level standard errors (research/tau-study.md: How τ is chosen)
CV_RULES = ("mean", "guarded", "near-base", "shifted", "lcb", "one-se")  # select_inv_tau: pick from the CV
ESS_RULES = ("ess-or-shifted", "ess-or-capped")  # KMeans: shifted's pick or the adaptive bandwidth (select_ess_or_shifted)
NO_CV_RULES = ("spread", "plug-in")  # auto rules that read no CV: kNN's spread temperature, KMeans' plug-in one
RULES = (*CV_RULES, "spread", *ESS_RULES, "plug-in")  # every auto rule (auto_choice)
DEFAULT_RULE = "shifted"  # the CV's default rule (research/tau-study.md: How τ is chosen; "mean" until it)
DEFAULT_RULES = {"km": "plug-in", "knn": "spread"}  # what --inv-tau auto uses per router (research/tau-study.md: How τ is chosen)
SPREAD_INV_TAU = 0.2  # rule "spread": 1/tau(x) = 0.2 / std(phi(x)) over the query's k neighbours
ESS_TARGET = 3.0  # the ESS_RULES: the adaptive bandwidth's effective sample size, in clusters
ESS_MARGIN = 0.5  # pp: the ESS_RULES take the adaptive bandwidth when its CV mean beats shifted's pick by more
SHIFT_CAP = 20.0  # rule "ess-or-capped": shifted's step stops at the paper's 1/tau ...
SHIFT_CAP_GAIN = 0.5  # pp: ... where the smoothed CV's top (at or below it) beats Base's CV mean by at least this
BV_WEIGHT = 0.125  # rule "plug-in": temperature "bv", the bias term's weight c (docs/prereg-km-plugin.md)
ROUTER_ONLY = {"spread": "knn", "ess-or-shifted": "km", "ess-or-capped": "km",
               "plug-in": "km"}  # rules measured for one router only
ROUTER_NAMES = {"km": "KMeans", "knn": "kNN"}
NO_CV_INV_TAU = 20.0  # auto with too few training tasks to cross-validate: the paper's 1/tau
FOLD_RULES = ("lcb", "one-se")  # the rules that read the folds apart (CVFolds), not only the mean curves


@dataclass(frozen=True)
class AutoChoice:
    """What ``--inv-tau auto`` resolved to: the router's ``inv_tau`` and ``temperature``, the rule that chose
    them, and the CV curves it read ({1/tau: (outlier, inlier)}, and {"ess:3": …} for the ``ESS_RULES``; empty
    for rule "spread" or too few tasks)."""
    inv_tau: float
    temperature: str
    rule: str
    curves: dict


def default_rule(router: str) -> str:
    """The rule ``--inv-tau auto`` uses for this router when none is named (``DEFAULT_RULES``)."""
    if router not in DEFAULT_RULES:
        raise ValueError(f"router={router!r}: allowed values are {', '.join(DEFAULT_RULES)}")
    return DEFAULT_RULES[router]


def check_rule(rule: str, router: str) -> str:
    """``rule`` if it is an auto rule usable with ``router`` (None: the router's default), else a ValueError
    naming what is allowed."""
    rule = default_rule(router) if rule is None else rule
    if rule not in RULES:
        raise ValueError(f"rule={rule!r}: allowed values are {', '.join(RULES)}")
    only = ROUTER_ONLY.get(rule, router)
    if only != router:
        what = (f"1/tau(x) = {SPREAD_INV_TAU:g} / std of the query's distances, no CV" if rule == "spread" else
                "per query the 1/tau minimizing the bias–variance bound over the clusters, no CV" if rule == "plug-in"
                else f"the CV's choice between {'shifted' if rule == 'ess-or-shifted' else 'capped shifted'} and the "
                f"adaptive bandwidth ess:{ESS_TARGET:g}")
        allowed = [r for r in RULES if ROUTER_ONLY.get(r, router) == router]
        raise ValueError(f"rule={rule!r} ({what}) is measured for {ROUTER_NAMES[only]} only; for router={router!r} "
                         f"allowed: {', '.join(allowed)}")
    return rule


def _base_index(grid, router: str) -> int:
    at = np.flatnonzero(np.isinf(grid) if router == "km" else grid == 0)
    if not len(at):
        raise ValueError(f"grid={[float(g) for g in grid]!r}: must contain the Base limit ({'inf' if router == 'km' else 0})")
    return int(at[0])


def smooth_curve(v) -> np.ndarray:
    """A CV curve averaged with its neighbours on the grid (the ends with their one neighbour)."""
    v = np.asarray(v, dtype=float)
    return np.array([v[max(0, i - 1): i + 2].mean() for i in range(len(v))])


def _toward_base(grid, candidates, router: str) -> int:
    """Of the grid positions ``candidates``, the one nearest the Base limit (KMeans: the largest 1/tau)."""
    return int(candidates[np.argmax(grid[candidates]) if router == "km" else np.argmin(grid[candidates])])


def select_inv_tau(out_cv, in_cv, router: str, grid=GRID, rule: str = DEFAULT_RULE, max_inlier_loss: float = 0.5,
                   tol: float = NEAR_BASE_TOL, folds: CVFolds | None = None, se_mult: float = SE_MULT) -> float:
    """Pick 1/tau from CV curves. ``mean``: best (outlier + inlier) / 2. ``guarded``: best outlier
    score among the 1/tau whose inlier score is within ``max_inlier_loss`` pp of the Base limit's.
    ``near-base``: among the 1/tau whose mean is within ``tol`` pp of the best mean, the one nearest the
    Base limit (KMeans: the largest, toward inf; kNN: the smallest, toward 0) — parsimony: tilt only as far
    as the CV can tell apart. ``shifted``: the argmax of the CV mean smoothed over grid neighbours
    (``smooth_curve``), then one grid step toward Base (the training CV's optimum sits further from Base than
    the test split's: research/tau-study.md, How τ is chosen). In ``mean`` and ``guarded``, ties go to the first (smaller) 1/tau.

    The fold rules read ``folds`` (``cv_folds``), per held-out task d_t(g) = its CV mean at g minus at the Base
    limit, and their standard error over the T tasks, se(g) = std_t(d_t(g)) / sqrt(T):
    ``lcb``: the largest lower confidence bound of the gain over Base, mean_t d_t(g) − se_mult · se(g) (Base
    scores 0, so a tilt is taken only when its gain is ``se_mult`` standard errors clear of nothing; between
    tilts of equal mean gain the steadier one wins). ``one-se``: Breiman's one-standard-error rule — among the
    1/tau whose mean is within ``se_mult`` standard errors (of the paired difference to the best) of the best,
    the one nearest Base: ``near-base`` with the tolerance the CV's own spread gives."""
    grid = np.asarray(grid, dtype=float)
    if rule == "mean":
        return float(grid[int(np.argmax((out_cv + in_cv) / 2))])
    if rule == "guarded":
        base = _base_index(grid, router)
        ok = in_cv >= in_cv[base] - max_inlier_loss
        return float(grid[int(np.argmax(np.where(ok, out_cv, -np.inf)))])
    if rule == "near-base":
        mean = (np.asarray(out_cv) + np.asarray(in_cv)) / 2
        return float(grid[_toward_base(grid, np.flatnonzero(mean >= mean.max() - tol), router)])
    if rule == "shifted":
        if np.any(np.diff(grid) <= 0):
            raise ValueError(f"grid={[float(g) for g in grid]!r}: rule 'shifted' smooths over grid neighbours and "
                             "needs an ascending grid")
        at = int(np.argmax(smooth_curve((np.asarray(out_cv) + np.asarray(in_cv)) / 2)))
        return float(grid[min(at + 1, len(grid) - 1) if router == "km" else max(at - 1, 0)])  # ascending: ±1
    if rule in FOLD_RULES:
        if folds is None:
            raise ValueError(f"rule={rule!r} reads the CV folds apart: pass folds= (tuning.cv_folds)")
        per_task = folds.by_task()
        if per_task.shape != (len(per_task), len(grid)) or len(per_task) < 2:
            raise ValueError(f"folds: {per_task.shape[0]} task(s) x {per_task.shape[1]} settings; "
                             f"the rule needs >= 2 tasks over the {len(grid)} settings of the grid")
        T = len(per_task)
        if rule == "lcb":
            d = per_task - per_task[:, [_base_index(grid, router)]]
            lcb = d.mean(axis=0) - se_mult * d.std(axis=0, ddof=1) / np.sqrt(T)
            return float(grid[_toward_base(grid, np.flatnonzero(lcb >= lcb.max()), router)])
        d = per_task - per_task[:, [int(np.argmax(per_task.mean(axis=0)))]]
        ok = d.mean(axis=0) + se_mult * d.std(axis=0, ddof=1) / np.sqrt(T) >= 0
        return float(grid[_toward_base(grid, np.flatnonzero(ok), router)])
    raise ValueError(f"rule={rule!r}: allowed values are {', '.join(CV_RULES)}"
                     + (f" ({rule!r} is resolved by tuning.auto_choice)" if rule in RULES else ""))


def select_ess_or_shifted(out_cv, in_cv, grid=GRID, margin: float = ESS_MARGIN, cap: float | None = None,
                          cap_gain: float = SHIFT_CAP_GAIN):
    """KMeans' rules "ess-or-shifted" (``cap=None``) and "ess-or-capped" (``cap=SHIFT_CAP``): CV curves over the fixed
    ``grid`` followed by one last entry, the adaptive bandwidth (``estimates_over``'s ``ess:ESS_TARGET``). Returns
    (inv_tau, temperature): ``(ESS_TARGET, "ess")`` when that entry's CV mean (outlier + inlier) / 2 is more than
    ``margin`` pp above the CV mean at ``shifted``'s pick over the grid, else ``(shifted's pick, "fixed")``. The
    margin keeps the fixed grid's choice where the CV cannot tell the two apart (research/tau-study.md: How τ is chosen).
    With ``cap``, a fixed pick past ``cap`` whose smoothed CV top is at or below ``cap`` (the step overshot it), where
    the CV mean at that top beats Base's (the grid's inf) by at least ``cap_gain`` pp, becomes ``cap``; the ess
    decision is made first, against the uncapped pick (docs/prereg-km-cap20-ess-first.md)."""
    out_cv, in_cv = np.asarray(out_cv, dtype=float), np.asarray(in_cv, dtype=float)
    if out_cv.shape != in_cv.shape or out_cv.shape != (len(grid) + 1,):
        raise ValueError(f"CV curves of shapes {out_cv.shape} / {in_cv.shape}: expected ({len(grid) + 1},), the "
                         f"{len(grid)} settings of the grid and then ess:{ESS_TARGET:g}")
    g = len(grid)
    values = list(np.asarray(grid, dtype=float))
    if cap is not None and cap not in values:
        raise ValueError(f"cap={cap!r}: must be a value of the grid {values!r}")
    chosen = select_inv_tau(out_cv[:g], in_cv[:g], "km", grid, "shifted")
    mean = (out_cv + in_cv) / 2
    if mean[g] > mean[values.index(chosen)] + margin:
        return ESS_TARGET, "ess"
    if cap is not None:
        top = int(np.argmax(smooth_curve(mean[:g])))
        if chosen > cap >= values[top] and mean[top] - mean[_base_index(np.asarray(values), "km")] >= cap_gain:
            return cap, "fixed"
    return chosen, "fixed"


def auto_choice(X, acc, cost, tasks, router: str, hp: dict, protocol: str = "leave-task-out", few_shot: int = 25,
                seed: int = 42, grid=GRID, rule: str | None = None, repeats: int = CV_REPEATS) -> AutoChoice:
    """Resolve ``--inv-tau auto`` from the training set only: rule "spread" (kNN's default) is the spread
    temperature at ``SPREAD_INV_TAU``; "plug-in" (KMeans' default) the bias–variance temperature "bv" at
    ``BV_WEIGHT``, no CV either; "ess-or-capped" and "ess-or-shifted" run the CV over ``grid`` and the adaptive
    bandwidth (``select_ess_or_shifted``, capped at ``SHIFT_CAP`` or not); every other rule picks a fixed 1/tau from
    the CV (``auto_inv_tau``)."""
    rule = check_rule(rule, router)
    if rule == "spread":
        return AutoChoice(SPREAD_INV_TAU, "spread", rule, {})
    if rule == "plug-in":
        return AutoChoice(BV_WEIGHT, "bv", rule, {})
    if rule in ESS_RULES:
        folds, curves = _cv(X, acc, cost, tasks, router, hp, protocol, few_shot, seed, (*grid, f"ess:{ESS_TARGET:g}"),
                            repeats)
        if folds is None:
            return AutoChoice(NO_CV_INV_TAU, "fixed", rule, {})
        cap = SHIFT_CAP if rule == "ess-or-capped" else None
        return AutoChoice(*select_ess_or_shifted(*folds.curves(), grid, cap=cap), rule, curves)
    chosen, curves = auto_inv_tau(X, acc, cost, tasks, router, hp, protocol=protocol, few_shot=few_shot, seed=seed,
                                  grid=grid, rule=rule, repeats=repeats)
    return AutoChoice(chosen, "fixed", rule, curves)


def auto_inv_tau(X, acc, cost, tasks, router: str, hp: dict, protocol: str = "leave-task-out", few_shot: int = 25,
                 seed: int = 42, grid=GRID, rule: str = DEFAULT_RULE, repeats: int = CV_REPEATS):
    """Return (chosen 1/tau, {1/tau: (CV outlier score, CV inlier score)}) from the training set only;
    ``repeats``: the CV's folds over that many random 80/20 splits, averaged (``cv_folds``); ``rule``: one of
    ``RULES`` (``select_inv_tau``)."""
    folds, curves = _cv(X, acc, cost, tasks, router, hp, protocol, few_shot, seed, grid, repeats)
    if folds is None:
        return NO_CV_INV_TAU, {}
    return select_inv_tau(*folds.curves(), router, grid, rule, folds=folds), curves


def _cv(X, acc, cost, tasks, router, hp, protocol, few_shot, seed, settings, repeats):
    """``cv_folds`` over ``settings`` and its curves as {setting: (CV outlier score, CV inlier score)}, a number's
    key as a float and a named setting's (``"ess:3"``) as its name; (None, {}) when too few tasks to hold out."""
    folds = cv_folds(X, acc, cost, tasks, router, hp, protocol, few_shot, seed, settings, repeats=repeats)
    if folds is None:
        return None, {}
    keys = [v if isinstance(v, str) else float(v) for v in settings]
    return folds, {k: (float(o), float(i)) for k, o, i in zip(keys, *folds.curves())}
