"""Which way of choosing 1/tau works? Compares, on the real tables, the training-only rules of
``cv`` (research/tau/cv.py) with every fixed 1/tau of the grid, against the test split (not a timed test).

    python research/tau/tau_selection.py [--configs study|out-of-sample|fresh|fresh2|…|fresh10] [--routers km|knn]
                                  [--json out/tau_sel_folds_study.json]
    python research/tau/tau_selection.py --from-json a.json,b.json,... [--plot out/tau_rules.png] [--per-config]
    python research/tau/tau_selection.py --recheck a.json,b.json,... --seeds 1,2,3,4,5,6,8,9,10,11 --json out/recheck.json
    python research/tau/tau_selection.py --rerun a.json,b.json,... --seeds 1,2,3,4,5,6,8,9,10,11 --no-cv --json out/r.json

For every configuration of bench/real_tables.sh and seeds 42, 7, 99 it computes the leave-one-task-out
CV curves on the training set, then the test scores of Prox at every 1/tau of the grid (Base is the
grid's limit: inf for KMeans, 0 for kNN). Besides the fixed 1/tau it scores per-query temperatures
``rel:a`` (1/tau(x) = a / phi_min(x), ``cv.estimates_over``) and ``spr:a`` (1/tau(x) = a /
std(phi(x)), the distances in units of their own spread) and ``mix:a,b,...`` (the weights averaged over
several fixed 1/tau: an ensemble over temperatures). Printed: for each selection rule
(each reads only the configuration's own training CV curves) and each fixed setting, the mean over
configurations of Prox − Base on the outlier, inlier and overall splits, and how many configurations
lose more than 0.3 pp of outlier or 0.5 pp of inlier score. The "Brier CV" rules pick from CV curves of
the estimates' mean squared error (``tuning.brier_score``) instead of the AUC: a smoother criterion
(with ``--brier``). "nearest Base within t pp" (parsimony, ``tuning.select_inv_tau(rule="near-base")``) takes,
among the fixed 1/tau whose CV mean is within t pp of the best, the one nearest the Base limit; "one step toward
Base" is ``rule="shifted"``; ``ess:E`` is the adaptive bandwidth (per query the 1/tau at which the weights'
effective sample size is E), and "shifted, or ess:E where its CV mean is m pp higher" is
``tuning.select_ess_or_shifted``, what KMeans' ``--inv-tau auto`` used at E = 3, m = 0.5 before the plug-in
temperature (the rows "fixed bv:c"; ``research/tau/km_plugin.py`` reports it; kNN's auto is the row "fixed spr:0.2", rule
"spread"); "lcb" and "one-se" read the CV folds apart (saved in the JSON as ``folds_cv``; runs saved before that
skip them). The CV averages its folds over ``--cv-repeats`` random
splits (default: as ``--inv-tau auto``, ``tuning.CV_REPEATS``; 1 is the one-pass CV of the earlier saved runs).
Besides the rule table, each router's report gives its auto rule (``AUTO``; for KMeans the CV rule it had before the
plug-in) per table x protocol against the best fixed 1/tau in hindsight, with a bootstrap interval and the fixed
1/tau chosen without the configuration (``by_group``), and how many losing configurations the seeds' own noise
predicts (``noise``); with several saved runs, all of them pooled too. ``--recheck``: the configurations that lose
under their router's auto rule in saved runs, run again on other ``--seeds`` (research/tau-study.md: how much of what is left is
noise); ``--rerun``: every configuration of saved runs, run again (research/tau-study.md: seeds10).
``--configs``: the study's configurations (those of bench/real_tables.sh) or one of the twelve further sets, each
defined before the rules it was used to check (research/tau-study.md: How τ is chosen).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from proxray.embeddings.encoder import SentenceEncoder
from proxray.experiments.protocols import protocol_split
from proxray.experiments.metrics import routing_score
from proxray.common.storage import replace_atomically
from proxray.data.table import RoutingTable
from cv import (CV_REPEATS, ESS_MARGIN, ESS_TARGET, GRID, ROUTER_NAMES, SHIFT_CAP, SHIFT_CAP_GAIN, CVFolds,
                            cv_folds, estimates_over, make_router, select_ess_or_shifted, select_inv_tau, smooth_curve)

D = Path(__file__).resolve().parents[2].parent / "shared" / "data"
CONFIGS = (
    [("routerbench_slice", r, p, [o]) for o in ("mbpp", "arc-challenge", "winogrande")
     for r, p in (("km", "leave-task-out"), ("knn", "few-shot-outlier"))]
    + [("bbh19_dev", r, p, o) for o in (["boolean_expressions", "navigate", "object_counting"],
                                         ["geometric_shapes", "ruin_names", "movie_recommendation",
                                          "salient_translation_error_detection"])
       for p in ("leave-task-out", "few-shot-outlier") for r in ("km", "knn")]
    + [("routerdc7", "km", "leave-task-out", ["gsm8k", "math_prealgebra"]),
       ("routerdc7", "knn", "few-shot-outlier", ["gsm8k", "math_prealgebra"]),
       ("routerdc7", "km", "leave-task-out", ["humaneval", "mbpp", "javascript"])])
SEEDS = (42, 7, 99)
OUT_OF_SAMPLE = (  # other outlier sets / protocols of the same tables, never used to choose anything here
    [("routerbench_slice", "km", "few-shot-outlier", [o]) for o in ("mbpp", "arc-challenge", "winogrande")]
    + [("routerbench_slice", "knn", "leave-task-out", [o]) for o in ("mbpp", "arc-challenge", "winogrande")]
    + [("bbh19_dev", r, p, ["logical_deduction_seven_objects", "logical_deduction_three_objects", "tracking_shuffled_objects_five_objects"]) for r in ("km", "knn") for p in ("leave-task-out", "few-shot-outlier")]
    + [("bbh19_dev", r, "leave-task-out", ["reasoning_about_colored_objects", "tracking_shuffled_objects_three_objects"]) for r in ("km", "knn")]
    + [("routerdc7", r, p, ["mmlu", "cmmlu", "ceval"]) for r in ("km", "knn") for p in ("leave-task-out", "few-shot-outlier")]
    + [("routerdc7", "km", "few-shot-outlier", ["gsm8k", "math_prealgebra"]), ("routerdc7", "knn", "leave-task-out", ["humaneval", "mbpp", "javascript"]),
       ("routerdc7", "knn", "leave-task-out", ["arc_easy", "arc_challenge"]), ("routerdc7", "km", "leave-task-out", ["arc_easy", "arc_challenge"])])
FRESH = (  # a third set, first run after the parsimony rules below were read off the other two
    [("bbh19_dev", r, p, o) for o in (["navigate", "ruin_names"],
                                       ["geometric_shapes", "logical_deduction_three_objects", "tracking_shuffled_objects_three_objects"],
                                       ["boolean_expressions", "movie_recommendation"],
                                       ["object_counting", "reasoning_about_colored_objects", "salient_translation_error_detection"])
     for r in ("km", "knn") for p in ("leave-task-out", "few-shot-outlier")]
    + [("routerdc7", "km", "few-shot-outlier", ["humaneval", "mbpp", "javascript"]),
       ("routerdc7", "knn", "few-shot-outlier", ["arc_easy", "arc_challenge"])])
FRESH2 = (  # a fourth set, defined before the CV-spread rules (select_inv_tau rule="lcb") were measured anywhere
    [("bbh19_dev", r, p, o) for o in (["logical_deduction_seven_objects", "navigate", "salient_translation_error_detection"],
                                       ["movie_recommendation", "object_counting", "tracking_shuffled_objects_five_objects"],
                                       ["boolean_expressions", "reasoning_about_colored_objects", "ruin_names", "geometric_shapes"])
     for r in ("km", "knn") for p in ("leave-task-out", "few-shot-outlier")]
    + [("routerdc7", "km", "few-shot-outlier", ["arc_easy", "arc_challenge"]),
       ("routerdc7", "knn", "few-shot-outlier", ["humaneval", "mbpp", "javascript"]),
       ("routerdc7", "knn", "leave-task-out", ["gsm8k", "math_prealgebra"]),
       ("routerdc7", "km", "leave-task-out", ["gsm8k", "mbpp"])])
FRESH3 = (  # a fifth set, defined after shifted became the default, to check it once more
    [("bbh19_dev", r, p, o) for o in (["tracking_shuffled_objects_three_objects", "salient_translation_error_detection", "ruin_names"],
                                       ["logical_deduction_three_objects", "movie_recommendation", "navigate"],
                                       ["tracking_shuffled_objects_five_objects", "geometric_shapes", "reasoning_about_colored_objects"])
     for r in ("km", "knn") for p in ("leave-task-out", "few-shot-outlier")]
    + [("routerdc7", "km", "few-shot-outlier", ["ceval", "arc_challenge"]),
       ("routerdc7", "knn", "leave-task-out", ["arc_easy", "gsm8k"])])
FRESH4 = (  # a sixth set, defined before the spread temperature was proposed as kNN's auto (research/tau-study.md: spread)
    [("bbh19_dev", r, p, o) for o in (["logical_deduction_seven_objects", "boolean_expressions", "tracking_shuffled_objects_three_objects"],
                                       ["object_counting", "ruin_names", "logical_deduction_three_objects"],
                                       ["navigate", "geometric_shapes", "salient_translation_error_detection", "tracking_shuffled_objects_five_objects"])
     for r in ("km", "knn") for p in ("leave-task-out", "few-shot-outlier")]
    + [("routerdc7", "knn", "few-shot-outlier", ["cmmlu", "javascript"]),
       ("routerdc7", "km", "leave-task-out", ["mmlu", "math_prealgebra"])])
FRESH5 = (  # a seventh set, KMeans only, defined before the per-query KMeans kernels of research/tau/km_kernels.py were
    # read (BBH outliers drawn by np.random.default_rng(2026); routerdc7 pairs no earlier set used)
    [("bbh19_dev", "km", p, o) for o in (["boolean_expressions", "logical_deduction_three_objects", "navigate"],
                                         ["boolean_expressions", "reasoning_about_colored_objects", "ruin_names"],
                                         ["logical_deduction_seven_objects", "reasoning_about_colored_objects",
                                          "tracking_shuffled_objects_five_objects", "tracking_shuffled_objects_three_objects"])
     for p in ("leave-task-out", "few-shot-outlier")]
    + [("routerdc7", "km", "few-shot-outlier", ["cmmlu", "humaneval"]), ("routerdc7", "km", "leave-task-out", ["ceval", "javascript"]),
       ("routerdc7", "km", "few-shot-outlier", ["mmlu", "gsm8k"]), ("routerdc7", "km", "leave-task-out", ["arc_easy", "math_prealgebra"])])
FRESH6 = (  # an eighth set, KMeans only, defined before the capped rule (docs/prereg-km-cap20.md) was tested: drawn by
    # np.random.default_rng(2027), 3 BBH outlier sets (sizes 2, 3, 3) x both protocols and 4 routerdc7 pairs
    # (protocols alternating), each draw that repeats an earlier set's configuration skipped
    [("bbh19_dev", "km", p, o) for o in (["boolean_expressions", "object_counting"],
                                         ["boolean_expressions", "logical_deduction_three_objects",
                                          "tracking_shuffled_objects_five_objects"],
                                         ["movie_recommendation", "ruin_names", "salient_translation_error_detection"])
     for p in ("leave-task-out", "few-shot-outlier")]
    + [("routerdc7", "km", "few-shot-outlier", ["cmmlu", "gsm8k"]), ("routerdc7", "km", "leave-task-out", ["javascript", "math_prealgebra"]),
       ("routerdc7", "km", "few-shot-outlier", ["ceval", "cmmlu"]), ("routerdc7", "km", "leave-task-out", ["javascript", "mbpp"])])
_FRESH7_BBH = (
    ["movie_recommendation", "object_counting"],
    ["logical_deduction_seven_objects", "navigate", "ruin_names"],
    ["logical_deduction_three_objects", "salient_translation_error_detection", "tracking_shuffled_objects_five_objects"],
    ["navigate", "object_counting", "reasoning_about_colored_objects", "tracking_shuffled_objects_three_objects"],
    ["boolean_expressions", "logical_deduction_three_objects"],
    ["boolean_expressions", "logical_deduction_seven_objects", "tracking_shuffled_objects_five_objects"],
    ["reasoning_about_colored_objects", "salient_translation_error_detection", "tracking_shuffled_objects_five_objects"],
    ["geometric_shapes", "logical_deduction_seven_objects", "movie_recommendation", "salient_translation_error_detection"],
    ["logical_deduction_seven_objects", "salient_translation_error_detection"],
    ["logical_deduction_seven_objects", "logical_deduction_three_objects", "ruin_names"],
    ["logical_deduction_seven_objects", "ruin_names", "tracking_shuffled_objects_three_objects"],
    ["geometric_shapes", "logical_deduction_three_objects", "navigate", "reasoning_about_colored_objects"])
FRESH7 = (  # a ninth set, KMeans only, defined before the rule of docs/prereg-km-cap20-ess-first.md was tested: drawn by
    # np.random.default_rng(2028) (the script is in that file), 12 BBH leave-task-out outlier sets (sizes 2, 3, 3, 4
    # repeating; the group where the rule acts), the first 4 also few-shot, and 2 routerdc7 pairs, one per protocol;
    # each draw that repeats an earlier set's configuration skipped
    [("bbh19_dev", "km", "leave-task-out", o) for o in _FRESH7_BBH]
    + [("bbh19_dev", "km", "few-shot-outlier", o) for o in _FRESH7_BBH[:4]]
    + [("routerdc7", "km", "leave-task-out", ["arc_easy", "mmlu"]),
       ("routerdc7", "km", "few-shot-outlier", ["humaneval", "javascript"])])
FRESH8 = (  # a tenth set, KMeans only, defined before the guard of docs/prereg-km-guard.md was tested (run on 10 seeds):
    # drawn by np.random.default_rng(2029) (the script is in that file), 6 routerdc7 pairs (protocols alternating; where
    # Prox gains little and the guard acts) and 2 BBH outlier sets of 3, one per protocol; repeats of earlier sets skipped
    [("routerdc7", "km", "leave-task-out", ["ceval", "math_prealgebra"]),
     ("routerdc7", "km", "few-shot-outlier", ["arc_challenge", "mmlu"]),
     ("routerdc7", "km", "leave-task-out", ["gsm8k", "humaneval"]),
     ("routerdc7", "km", "few-shot-outlier", ["gsm8k", "humaneval"]),
     ("routerdc7", "km", "leave-task-out", ["ceval", "gsm8k"]),
     ("routerdc7", "km", "few-shot-outlier", ["arc_challenge", "mbpp"]),
     ("bbh19_dev", "km", "leave-task-out", ["logical_deduction_three_objects", "object_counting",
                                            "salient_translation_error_detection"]),
     ("bbh19_dev", "km", "few-shot-outlier", ["boolean_expressions", "geometric_shapes", "object_counting"])])
FRESH9 = (  # an eleventh set, KMeans only, defined before the task-local rule of docs/prereg-km-task-local.md was tested
    # (run on 10 seeds): drawn by np.random.default_rng(2030) with the script of docs/prereg-km-guard.md, 6 routerdc7
    # pairs (protocols alternating) and 2 BBH outlier sets of 3, one per protocol; repeats of earlier sets skipped
    [("routerdc7", "km", "leave-task-out", ["arc_challenge", "cmmlu"]),
     ("routerdc7", "km", "few-shot-outlier", ["arc_challenge", "math_prealgebra"]),
     ("routerdc7", "km", "leave-task-out", ["cmmlu", "humaneval"]),
     ("routerdc7", "km", "few-shot-outlier", ["arc_easy", "math_prealgebra"]),
     ("routerdc7", "km", "leave-task-out", ["arc_easy", "ceval"]),
     ("routerdc7", "km", "few-shot-outlier", ["cmmlu", "math_prealgebra"]),
     ("bbh19_dev", "km", "leave-task-out", ["geometric_shapes", "ruin_names", "tracking_shuffled_objects_three_objects"]),
     ("bbh19_dev", "km", "few-shot-outlier", ["logical_deduction_three_objects", "reasoning_about_colored_objects",
                                              "tracking_shuffled_objects_three_objects"])])
FRESH10 = (  # a twelfth set, KMeans only, defined before the plug-in temperature of docs/prereg-km-plugin.md was tested
    # (run on 10 seeds): drawn by np.random.default_rng(2031) with the script of docs/prereg-km-guard.md, 6 routerdc7
    # pairs (protocols alternating) and 2 BBH outlier sets of 3, one per protocol; repeats of earlier sets skipped
    [("routerdc7", "km", "leave-task-out", ["arc_challenge", "javascript"]),
     ("routerdc7", "km", "few-shot-outlier", ["gsm8k", "javascript"]),
     ("routerdc7", "km", "leave-task-out", ["math_prealgebra", "mbpp"]),
     ("routerdc7", "km", "few-shot-outlier", ["javascript", "mmlu"]),
     ("routerdc7", "km", "leave-task-out", ["cmmlu", "mbpp"]),
     ("routerdc7", "km", "few-shot-outlier", ["cmmlu", "mbpp"]),
     ("bbh19_dev", "km", "leave-task-out", ["logical_deduction_seven_objects", "logical_deduction_three_objects",
                                            "reasoning_about_colored_objects"]),
     ("bbh19_dev", "km", "few-shot-outlier", ["geometric_shapes", "logical_deduction_three_objects",
                                              "tracking_shuffled_objects_five_objects"])])


def _unseen_by_knn(*sets):
    """The configurations of these (KMeans) sets as kNN configurations, in order, without any a kNN set already had."""
    seen = {(n, p, tuple(sorted(o))) for cs in (CONFIGS, OUT_OF_SAMPLE, FRESH, FRESH2, FRESH3, FRESH4)
            for n, r, p, o in cs if r == "knn"}
    out = []
    for n, _, p, o in (c for cs in sets for c in cs):
        if (key := (n, p, tuple(sorted(o)))) not in seen:
            seen.add(key)
            out.append((n, "knn", p, o))
    return out


FRESH11 = (  # a thirteenth set, a measurement with no rule to adopt (docs/prereg-fresh11.md, committed before it ran):
    # kNN on every configuration of fresh5-fresh10 (KMeans only until now) that no kNN set had (62), and
    # routerbench_slice's three outlier pairs (the only outlier sets of its three tasks no set had) for both routers
    # and both protocols (12)
    _unseen_by_knn(FRESH5, FRESH6, FRESH7, FRESH8, FRESH9, FRESH10)
    + [("routerbench_slice", r, p, o) for o in (["arc-challenge", "winogrande"], ["arc-challenge", "mbpp"],
                                                ["mbpp", "winogrande"])
       for r in ("km", "knn") for p in ("leave-task-out", "few-shot-outlier")])
SETS = {"study": CONFIGS, "out-of-sample": OUT_OF_SAMPLE, "fresh": FRESH, "fresh2": FRESH2, "fresh3": FRESH3,
        "fresh4": FRESH4, "fresh5": FRESH5,
        "fresh6": FRESH6, "fresh7": FRESH7, "fresh8": FRESH8, "fresh9": FRESH9,
        "fresh10": FRESH10, "fresh11": FRESH11}  # --configs
REL = ("rel:0.5", "rel:1", "rel:2", "rel:5", "rel:10", "rel:20")  # per-query 1/tau = a / phi_min(x)
SPR = ("spr:0.1", "spr:0.2", "spr:0.3", "spr:0.5", "spr:1", "spr:2", "spr:4")  # per-query 1/tau = a / std(phi(x)) over its references
MIX = ("mix:1,2,5,10,20", "mix:2,5,10,20,50,100,200", "mix:5,20,100", "mix:20,inf", "mix:0,20",
       "mix:0,1,2,5,10,20,50,100,200,inf")  # weights averaged over several fixed 1/tau
ESS = ("ess:1.5", "ess:2", "ess:3", "ess:5", "ess:8")  # per-query 1/tau at which the weights' effective sample size is E
BV = ("bv:0.0625", "bv:0.125", "bv:0.25")  # KMeans: per-query plug-in 1/tau of the bias–variance bound, bias weight c
SETTINGS = (*GRID, *REL, *SPR, *MIX, *ESS, *BV)


def settings_for(router: str) -> tuple:
    """The settings a run of ``router`` scores: all of them for KMeans; kNN has no clusters for "bv:" to read."""
    return SETTINGS if router == "km" else SETTINGS[:len(SETTINGS) - len(BV)]


def test_splits(sp) -> dict:
    """The test split's query indices: outlier, inlier and overall."""
    return {"outlier": sp.test[sp.test_outlier], "inlier": sp.test[~sp.test_outlier], "overall": sp.test}


def fit_test_run(table, X, acc, cost, router, protocol, outliers, seed):
    """One configuration and seed as the study runs it: (the protocol's split, the hyperparameters, the Prox router
    fitted on its training set). research/tau/km_task_local.py refits saved runs through it."""
    sp = protocol_split(table.tasks, outliers, protocol, seed)
    hp = {"n_clusters": 32, "k": 100, "random_state": seed}
    tr = sp.base_train
    return sp, hp, make_router(router, "prox", hp).fit(X[tr], acc[tr], None if cost is None else cost[tr])


def run_config(table, X, acc, cost, router, protocol, outliers, seed, cv=True, brier=False, repeats=CV_REPEATS,
               fold_tasks=1):
    sp, hp, fitted = fit_test_run(table, X, acc, cost, router, protocol, outliers, seed)
    tr = sp.base_train
    c = (lambda idx: None if cost is None else cost[idx])
    scores = {k: [routing_score(a_hat, c_hat, acc[idx], c(idx))
                  for a_hat, c_hat in estimates_over(fitted, X[idx], settings_for(router))]
              for k, idx in test_splits(sp).items()}
    if not cv:
        return {"test": scores}
    curves = {}
    for score, name in (("routing", "cv"), ("brier", "brier"))[:2 if brier else 1]:
        folds = cv_folds(X[tr], acc[tr], c(tr), table.tasks[tr], router, hp, protocol, 25, seed, settings_for(router),
                         score=score, repeats=repeats, fold_tasks=len(outliers) if fold_tasks == "outliers" else int(fold_tasks))
        if folds is None:  # fewer than two training tasks (routerbench leave-task-out pairs): no CV, no CV rules
            break
        o, i = folds.curves()
        curves.update({f"out_{name}": o.tolist(), f"in_{name}": i.tolist()})
        if name == "cv":  # the folds apart, for rules that need the CV's own spread (select_inv_tau rule="lcb")
            curves["folds_cv"] = {"out": folds.out.tolist(), "in": folds.inl.tolist(), "groups": folds.groups}
    return {**curves, "test": scores}


_MEAN = lambda o, i, router: (o + i) / 2  # noqa: E731
_SMOOTHED = lambda o, i, router: smooth_curve((o + i) / 2)  # noqa: E731


def _select(rule, grid=GRID, **kw):
    """``tuning.select_inv_tau(rule=...)`` over ``grid`` (the fixed one, or the spread settings' a), as a curve whose
    argmax is its pick."""
    def curve(o, i, router):
        return (np.asarray(grid) == select_inv_tau(o, i, router, grid, rule, **kw)).astype(float)
    return curve


def _fold_rule(rule, se_mult=1.0):
    """``tuning.select_inv_tau(rule=...)`` over the fixed grid from the saved folds (``folds_cv``)."""
    def pick(s, router):
        f = s["folds_cv"]
        folds = CVFolds(np.array(f["out"])[:, :len(GRID)], np.array(f["in"])[:, :len(GRID)],
                        tuple(tuple(g) for g in f["groups"]))
        o, i = folds.curves()
        return GRID.index(select_inv_tau(o, i, router, GRID, rule, folds=folds, se_mult=se_mult))
    return pick


_SPREAD = range(len(GRID) + len(REL), len(GRID) + len(REL) + len(SPR))
_MIX = range(_SPREAD.stop, _SPREAD.stop + len(MIX))
_ESS = range(_MIX.stop, _MIX.stop + len(ESS))  # saved runs before ESS existed end at _MIX.stop: their rules are skipped
_SHIFTED = "auto, fixed grid, smoothed CV, one step toward Base (shifted: KMeans' default before ess-or-shifted)"
_GRID_ESS = [*range(len(GRID)), _ESS[ESS.index(f"ess:{ESS_TARGET:g}")]]  # the ESS_RULES' CV: the fixed grid, then ess:3


def _ess_rule_name(ess: str, margin: float) -> str:
    return (f"auto, shifted, or {ess} where its CV mean is {margin:g} pp higher"
            + (" (ess-or-shifted: KMeans' default before ess-or-capped)"
               if (ess, margin) == (f"ess:{ESS_TARGET:g}", ESS_MARGIN) else ""))


def ess_pick(o, i, margin=ESS_MARGIN, cap=None) -> int:
    """``tuning.select_ess_or_shifted`` on curves over the fixed grid followed by one ess setting, as the index of its
    pick in them (``len(GRID)``: the ess setting); with the defaults and ``cap=SHIFT_CAP``, KMeans' auto."""
    inv_tau, temperature = select_ess_or_shifted(o, i, GRID, margin, cap=cap)
    return len(GRID) if temperature == "ess" else GRID.index(inv_tau)


def _ess_or_shifted(margin, cap=None, guard=None):
    """``tuning.select_ess_or_shifted`` with ``margin`` (and ``cap``: rule "ess-or-capped") over the fixed grid and one
    ess setting after it (the rule's own target is ``tuning.ESS_TARGET``; other targets here are the same comparison),
    as a one-hot curve; with ``guard``, Base instead where the pick's CV mean beats Base's by less than ``guard`` pp
    (docs/prereg-km-guard.md)."""
    def curve(o, i, router):
        p = ess_pick(o, i, margin, cap)
        base = GRID.index(float("inf"))
        if guard is not None and (o[p] + i[p]) / 2 - (o[base] + i[base]) / 2 < guard:
            p = base
        return (np.arange(len(o)) == p).astype(float)
    return curve


def _ess_variant(kind: str, value: float):
    """Post hoc variants of ess-or-shifted (KMeans; the fixed grid, then ess:3 last; research/tau-study.md: how much is noise), each
    as a one-hot curve (its Base guard is ``_ess_or_shifted(guard=...)``): ``prior20`` — instead of shifting, the smoothed CV mean minus ``value`` pp per squared decade from the paper's
    1/tau = 20 (0 counted as 0.5, inf as 1000); ``weighted`` — the CV criterion ``value`` x outlier + (1 − value) x
    inlier instead of their mean; ``shift-if`` — one step toward Base only where the smoothed curve there is within
    ``value`` pp of its top; ``cap20`` — shifted, except that where the smoothed CV's top is at or below the paper's
    1/tau = 20 and its CV mean beats Base's by at least ``value`` pp, the step stops at 20 (docs/prereg-km-cap20.md;
    failed: ``CAP20_ESS_FIRST``, the same cap before the ess test, is KMeans' default ess-or-capped). Each applies
    ess-or-shifted's ess 3 test (CV mean > the pick's + ESS_MARGIN) after its own pick."""
    g = len(GRID)
    decades = np.log10([0.5 if v == 0 else 1000.0 if np.isinf(v) else v for v in GRID])

    def curve(o, i, router):
        mean = (o + i) / 2
        crit = value * o + (1 - value) * i if kind == "weighted" else mean
        smooth = smooth_curve(crit[:g])
        top = int(np.argmax(smooth))
        if kind == "prior20":
            p = int(np.argmax(smooth - value * (decades - np.log10(20.0)) ** 2))
        elif kind == "weighted":
            p = min(top + 1, g - 1)
        elif kind == "cap20":  # tuning's cap with the ess test left out (margin inf), so that it comes after the cap
            p = GRID.index(select_ess_or_shifted(o, i, GRID, np.inf, cap=20.0, cap_gain=value)[0])
        else:  # shift-if
            p = top + 1 if top + 1 < g and smooth[top + 1] >= smooth[top] - value else top
        p = g if mean[g] > mean[p] + ESS_MARGIN else p
        return (np.arange(len(o)) == p).astype(float)
    return curve


_VARIANTS = {"prior20": "smoothed CV − {:g} pp per squared decade from 1/tau = 20, or ess 3",
             "weighted": "shifted on {:g} x outlier + the rest x inlier CV, or ess 3",
             "shift-if": "shifted only where the step costs < {:g} pp of smoothed CV, or ess 3",
             "cap20": "shifted, not past 1/tau = 20 where the CV's top gains >= {:g} pp on Base, or ess 3"}


_VARIANT_RULES = {
    **{f"auto, ess-or-shifted, Base where its CV gain over Base is < {v:g} pp": (
        _GRID_ESS, _ess_or_shifted(ESS_MARGIN, guard=v), "cv") for v in (0.2, 0.5)},
    **{f"auto, {_VARIANTS[k].format(v)}": (_GRID_ESS, _ess_variant(k, v), "cv")
       for k, vs in (("prior20", (0.5, 1.0)), ("weighted", (0.25, 0.4)), ("shift-if", (0.2, 0.5)),
                     ("cap20", (ESS_MARGIN,))) for v in vs}}
CAP20 = f"auto, {_VARIANTS['cap20'].format(ESS_MARGIN)}"  # the candidate of docs/prereg-km-cap20.md (failed)
CAP20_ESS_FIRST = (f"auto, ess-or-shifted, its shift not past 1/tau = {SHIFT_CAP:g} where the CV's top gains >= "
                   f"{SHIFT_CAP_GAIN:g} pp on Base (ess-or-capped: KMeans' default)")  # docs/prereg-km-cap20-ess-first.md


def _guarded_name(guard: float) -> str:
    return f"auto, ess-or-capped, Base where its CV gain over Base is < {guard:g} pp"


GUARDED = _guarded_name(0.2)  # the candidate of docs/prereg-km-guard.md (failed on fresh8)
RULES = {  # name -> (settings it may pick from, how, which CV curves): each uses the configuration's own CV only
    "auto, fixed grid, mean (the default before)": (range(len(GRID)), _MEAN, "cv"),
    "auto, fixed grid, smoothed CV": (range(len(GRID)), _SMOOTHED, "cv"),
    **{f"auto, fixed grid, nearest Base within {t:g} pp of the best CV": (range(len(GRID)), _select("near-base", tol=t), "cv")
       for t in (0.05, 0.1, 0.2, 0.5, 1.0)},
    "auto, relative only": (range(len(GRID), len(GRID) + len(REL)), _MEAN, "cv"),
    "auto, fixed or relative": (range(len(GRID) + len(REL)), _MEAN, "cv"),
    "auto, spread only": (_SPREAD, _MEAN, "cv"),
    "auto, spread only, smoothed CV": (_SPREAD, _SMOOTHED, "cv"),
    # shifted over the spread settings (ascending a: larger is sharper, toward KMeans' Base)
    "auto, spread only, shifted (smoothed CV, one step toward Base)": (
        _SPREAD, _select("shifted", grid=tuple(float(a[4:]) for a in SPR)), "cv"),
    "auto, mixture only": (_MIX, _MEAN, "cv"),
    "auto, any": (range(_MIX.stop), _MEAN, "cv"),
    # the same from CV curves of the estimates' squared error instead of the AUC
    "auto (Brier CV), fixed grid": (range(len(GRID)), _MEAN, "brier"),
    "auto (Brier CV), spread only": (_SPREAD, _MEAN, "brier"),
    "auto (Brier CV), any": (range(_MIX.stop), _MEAN, "brier"),
    _SHIFTED: (range(len(GRID)), _select("shifted"), "cv"),
    # the adaptive bandwidth: per query the 1/tau at which the weights' effective sample size is E
    "auto, ess only": (_ESS, _MEAN, "cv"),
    "auto, fixed grid or ess": ([*range(len(GRID)), *_ESS], _MEAN, "cv"),
    **{_ess_rule_name(e, m): ([*range(len(GRID)), _ESS[ESS.index(e)]], _ess_or_shifted(m), "cv")
       for e in ("ess:2", "ess:3", "ess:5") for m in (0.0, 0.5, 1.0)},
    **_VARIANT_RULES,
    CAP20_ESS_FIRST: (_GRID_ESS, _ess_or_shifted(ESS_MARGIN, SHIFT_CAP), "cv"),
    **{_guarded_name(v): (_GRID_ESS, _ess_or_shifted(ESS_MARGIN, SHIFT_CAP, guard=v), "cv") for v in (0.2, 0.5)},
    # from the folds apart: the CV's spread over the held-out tasks (runs saved before --json kept them: skipped)
    **{f"auto, fixed grid, lcb ({m:g} se)": (None, _fold_rule("lcb", m), "folds") for m in (0.5, 1.0, 2.0)},
    **{f"auto, fixed grid, one-se ({m:g} se)": (None, _fold_rule("one-se", m), "folds") for m in (0.5, 1.0)},
}


KM_ONLY = ({name for name in RULES if name.startswith(("auto, shifted, or ess", "auto, ess-or-capped"))}
           | set(_VARIANT_RULES) | {CAP20_ESS_FIRST})  # shift toward inf
SPLITS = ("outlier", "inlier", "overall")


LOSS = {"outlier": 0.3, "inlier": 0.5}  # pp: a configuration "loses" when Prox − Base is below minus this (the router-quality target)


def _base(row) -> int:
    return GRID.index(float("inf")) if row["router"] == "km" else GRID.index(0.0)


def _deltas(row, picked, split) -> np.ndarray:
    """Prox − Base on ``split`` for each seed of ``row``, at the settings ``picked`` (one index per seed)."""
    base = _base(row)
    return np.array([s["test"][split][g] - s["test"][split][base] for s, g in zip(row["seeds"], picked)])


def fixed_deltas(row, split) -> np.ndarray:
    """Prox − Base on ``split`` at every fixed 1/tau of ``GRID``, per seed of ``row``: (seeds, len(GRID))."""
    base = _base(row)
    return np.array([np.asarray(s["test"][split][:len(GRID)]) - s["test"][split][base] for s in row["seeds"]])


def effect(rows, pick) -> dict:
    """Per configuration, Prox − Base on each split (mean over its seeds) when ``pick(seed_result)`` chooses the
    setting; and the configurations losing more than 0.3 pp outlier / 0.5 pp inlier (``LOSS``)."""
    d = {k: [] for k in SPLITS}
    for r in rows:
        picked = [pick(s) for s in r["seeds"]]
        for k in d:
            d[k].append(_deltas(r, picked, k).mean())
    d = {k: np.array(v) for k, v in d.items()}
    return {**d, "lose_out": int((d["outlier"] < -LOSS["outlier"]).sum()),
            "lose_in": int((d["inlier"] < -LOSS["inlier"]).sum())}


def pickers(rows):
    """(name, pick) for every rule the saved run allows (each reads the configuration's own CV only), then every
    fixed setting."""
    held = min(len(r["seeds"][0]["test"]["overall"]) for r in rows)  # runs saved before BV (or ESS): fewer settings
    for name, (allowed, curve, src) in RULES.items():
        if any((f"{src}_cv" if src == "folds" else f"out_{src}") not in r["seeds"][0] for r in rows):
            continue  # run with --no-cv, or saved before these CV curves existed
        if rows[0]["router"] != "km" and name in KM_ONLY:
            continue  # select_ess_or_shifted shifts toward KMeans' Base (inf)
        if src == "folds":
            yield name, (lambda s, curve=curve: curve(s, rows[0]["router"]))
            continue
        allowed = list(allowed)
        if max(allowed) >= min(len(r["seeds"][0][f"out_{src}"]) for r in rows):
            continue  # saved before these settings existed
        def pick(s, allowed=allowed, curve=curve, src=src):
            v = curve(np.array(s[f"out_{src}"])[allowed], np.array(s[f"in_{src}"])[allowed], rows[0]["router"])
            return allowed[int(np.argmax(v))]
        yield name, pick
    for gi, g in enumerate(SETTINGS[:held]):
        yield f"fixed {'1/tau = ' + format(g, 'g') if not isinstance(g, str) else g}", (lambda s, gi=gi: gi)


def summarize(rows):
    lines = ["| rule | Δ outlier (pp) | Δ inlier (pp) | Δ overall (pp) | configs losing > 0.3 pp outlier | "
             "configs losing > 0.5 pp inlier |", "|---|---|---|---|---|---|"]
    for name, pick in pickers(rows):
        e = effect(rows, pick)
        lines.append(f"| {name} | {e['outlier'].mean():+.2f} | {e['inlier'].mean():+.2f} | "
                     f"{e['overall'].mean():+.2f} | {e['lose_out']}/{len(rows)} | {e['lose_in']}/{len(rows)} |")
    return "\n".join(lines)


# the row each router's auto is read from: kNN's --inv-tau auto; for KMeans the CV rule it had until the plug-in
# temperature (tuning.DEFAULT_RULES; the CV runs, older saved runs hold no "bv:" scores) — research/tau/km_plugin.py
# compares the plug-in with it
AUTO = {"km": CAP20_ESS_FIRST, "knn": "fixed spr:0.2"}
PLOTTED = {"CV auto (KM ess-or-capped, kNN spread 0.2)": AUTO,
           "mean (before shifted)": "auto, fixed grid, mean (the default before)",
           "ess-or-shifted (KM's default before)": {"km": _ess_rule_name(f"ess:{ESS_TARGET:g}", ESS_MARGIN)},
           "shifted (KM's before that)": _SHIFTED,
           "near-base 1 pp": "auto, fixed grid, nearest Base within 1 pp of the best CV"}


def _auto_pick(rows):
    """The pick of the rows' router's auto rule (``AUTO``), or None where it needs CV curves the rows lack."""
    return dict(pickers(rows)).get(AUTO[rows[0]["router"]])


def plot_sets(sets: dict, path) -> None:
    """One panel per router: Prox − Base overall (mean over configurations) of the main rules and of the best
    fixed 1/tau in hindsight on each saved set, each bar labelled with its losing configurations
    (outlier/inlier)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routers = [k for k in ("km", "knn") if any(r["router"] == k for rows in sets.values() for r in rows)]
    width_in = max(6.5, 0.95 * len(sets) + 1.5)  # one set's bars and its two-line label need ~0.95 in
    fig, axes = plt.subplots(1, len(routers), figsize=(width_in * len(routers) + 1, 5.2), squeeze=False)
    for ax, router in zip(axes[0], routers):
        names = list(PLOTTED) + ["best fixed 1/τ (hindsight)"]
        width = 0.8 / len(names)
        for si, (label, rows) in enumerate(sets.items()):
            rows = [r for r in rows if r["router"] == router]
            picks = dict(pickers(rows))
            fixed = [effect(rows, lambda s, g=g: g) for g in range(len(GRID))]
            best = int(np.argmax([e["overall"].mean() for e in fixed]))
            chosen = {n: (v.get(router) if isinstance(v, dict) else v) for n, v in PLOTTED.items()}
            effects = [effect(rows, picks[chosen[n]]) if chosen[n] in picks else None for n in PLOTTED]
            for ni, e in enumerate(effects + [fixed[best]]):
                if e is None:
                    continue
                x = si + (ni - (len(names) - 1) / 2) * width
                ax.bar(x, e["overall"].mean(), width, color=f"C{ni}", label=names[ni] if si == 0 else None)
                tag = f"{e['lose_out']}/{e['lose_in']}" + (f"\n1/τ={GRID[best]:g}" if ni == len(effects) else "")
                ax.annotate(tag, (x, e["overall"].mean()), ha="center", va="bottom", fontsize=6)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(range(len(sets)), [f"{k}\n({len([r for r in v if r['router'] == router])} configs)"
                                         for k, v in sets.items()], fontsize=8)
        ax.set_ylabel("Prox − Base, overall AUC (pp)")
        ax.set_title(f"{router}: τ rules vs the best fixed 1/τ (labels: losing configs out/in)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=3)
    save_figure(fig, path)


def cv_agreement(rows) -> str:
    """How well the training CV curve orders the fixed grid as the test split does: Spearman's rho over the
    whole grid and among the 4 best settings on test, and the regret (test pp) of the CV-chosen 1/tau."""
    from scipy.stats import spearmanr

    rho, rho_top, regret = [], [], []
    for r in rows:
        for s in r["seeds"]:
            cv = (np.array(s["out_cv"])[:len(GRID)] + np.array(s["in_cv"])[:len(GRID)]) / 2
            te = np.array(s["test"]["overall"])[:len(GRID)]
            top = np.argsort(te)[-4:]
            rho.append(spearmanr(cv, te).statistic)
            rho_top.append(spearmanr(cv[top], te[top]).statistic)
            regret.append(te.max() - te[int(np.argmax(cv))])
    return (f"CV vs test over the fixed grid: Spearman {np.nanmean(rho):.2f}, among the 4 best on test "
            f"{np.nanmean(rho_top):.2f}; regret of the CV pick {np.mean(regret):.2f} pp (median {np.median(regret):.2f})")


def group_stats(rows, resamples: int = 10_000, seed: int = 0) -> list:
    """Per table x protocol (the target's unit), Prox − Base overall (mean over the group's configurations): the
    router's auto rule (``AUTO``) against the best fixed 1/tau of the group in hindsight; their paired difference
    with a 95 % bootstrap interval over the group's configurations, the best fixed 1/tau re-chosen in every resample
    (so the hindsight choice's own optimism is inside the interval); and the fixed 1/tau a user could have known,
    chosen on the group's other configurations (leave one configuration out) and scored on the one left out (None
    for a group of one). One dict per group; [] when the run has no auto rule (KMeans' needs the CV curves)."""
    pick = _auto_pick(rows)
    if pick is None:
        return []
    rng = np.random.default_rng(seed)
    groups = {}
    for r in rows:
        groups.setdefault((r["table"], r["protocol"]), []).append(r)
    out = []
    for (table, protocol), rs in sorted(groups.items()):
        auto = effect(rs, pick)["overall"]
        fixed = np.stack([effect(rs, lambda s, g=g: g)["overall"] for g in range(len(GRID))], axis=1)  # (C, G)
        out.append({"table": table, "protocol": protocol, **against_fixed(auto, fixed, rng, resamples)})
    return out


def against_fixed(auto, fixed, rng, resamples: int = 10_000) -> dict:
    """A rule's per-configuration Prox − Base ``auto`` (C,) against the fixed 1/tau's ``fixed`` (C, len(GRID)) of one
    group: the means, the best fixed 1/tau in hindsight, the paired difference's 95 % bootstrap interval with the best
    re-chosen in every resample, and the fixed 1/tau chosen without each configuration (None for one)."""
    best = int(np.argmax(fixed.mean(axis=0)))
    diffs = []
    for _ in range(resamples):
        ix = rng.integers(0, len(auto), len(auto))
        diffs.append(auto[ix].mean() - fixed[ix, int(np.argmax(fixed[ix].mean(axis=0)))].mean())
    loo = (float(np.mean([fixed[c, int(np.argmax(np.delete(fixed, c, axis=0).mean(axis=0)))]
                          for c in range(len(auto))])) if len(auto) > 1 else None)
    return {"n": len(auto), "auto": float(auto.mean()), "best": GRID[best], "best_fixed": float(fixed[:, best].mean()),
            "interval": tuple(float(v) for v in np.percentile(diffs, [2.5, 97.5])), "loo": loo}


def by_group(rows, resamples: int = 10_000, seed: int = 0) -> str:
    """``group_stats`` as a Markdown table."""
    lines = ["| table, protocol (configurations) | auto | best fixed 1/tau (hindsight) | auto − best fixed [95 % "
             "bootstrap, re-chosen] | fixed 1/tau chosen on the other configurations |", "|---|---|---|---|---|"]
    for g in group_stats(rows, resamples, seed):
        lo, hi = g["interval"]
        loo = "—" if g["loo"] is None else f"{g['loo']:+.2f}"
        lines.append(f"| {g['table']}, {g['protocol']} ({g['n']}) | {g['auto']:+.2f} | {g['best']:g}: "
                     f"{g['best_fixed']:+.2f} | {g['auto'] - g['best_fixed']:+.2f} [{lo:+.2f}, {hi:+.2f}] | {loo} |")
    return "\n".join(lines)


def plot_groups(rows, path) -> None:
    """One panel per router: per table x protocol, auto, the best fixed 1/tau in hindsight and the fixed 1/tau chosen
    without the configuration (``group_stats``), Prox − Base overall; above each group auto − best fixed with its
    bootstrap interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    of = {k: [r for r in rows if r["router"] == k] for k in ("km", "knn")}
    per_router = {k: stats for k in of if of[k] and (stats := group_stats(of[k]))}  # KMeans' auto needs the CV curves
    fig, axes = plt.subplots(1, len(per_router), figsize=(7 * len(per_router), 5), squeeze=False)
    for ax, (router, stats) in zip(axes[0], per_router.items()):
        bars = (("auto", lambda g: g["auto"]), ("best fixed 1/τ (hindsight)", lambda g: g["best_fixed"]),
                ("fixed 1/τ chosen without the configuration", lambda g: g["loo"]))
        for bi, (label, value) in enumerate(bars):
            xs = [gi + (bi - 1) * 0.27 for gi, g in enumerate(stats) if value(g) is not None]
            ax.bar(xs, [value(g) for g in stats if value(g) is not None], 0.27, color=f"C{bi}", label=label)
        for gi, g in enumerate(stats):
            lo, hi = g["interval"]
            top = max(v for v in (g["auto"], g["best_fixed"], g["loo"] or 0.0, 0.0))
            ax.annotate(f"{g['auto'] - g['best_fixed']:+.2f}\n[{lo:+.2f}, {hi:+.2f}]", (gi, top), ha="center",
                        va="bottom", fontsize=7)
        seeds = sorted({len(r["seeds"]) for r in of[router]})
        group_axes(ax, [(g["table"], g["protocol"], g["n"]) for g in stats],
                   f"{ROUTER_NAMES[router]}: auto vs fixed 1/τ per table × protocol, {sum(g['n'] for g in stats)} "
                   f"configurations × {'/'.join(map(str, seeds))} seeds\n(labels: auto − best fixed, 95 % bootstrap)")
    save_figure(fig, path)


def group_axes(ax, groups, title: str) -> None:
    """The look of a per table x protocol bar panel: ``groups`` (table, protocol, configurations) as x labels, the
    zero line, Prox − Base as y, ``title``, headroom for the labels above the bars, the legend below."""
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(range(len(groups)), [f"{t.split('_')[0]}\n{p.split('-')[0]} ({n})" for t, p, n in groups], fontsize=8)
    ax.set_ylabel("Prox − Base, overall AUC (pp)")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.15)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)


def save_figure(fig, path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    print(f"wrote {path}")


def noise(rows) -> str:
    """How many losing configurations the seeds alone explain. Under the auto rule (``AUTO``), a configuration's
    Prox − Base is a mean over its seeds with standard error std / sqrt(seeds); if every configuration's true effect
    were its table x protocol group's mean, with normal errors of that size, the expected number of losing
    configurations is the sum of their probabilities to fall below the threshold (``LOSS``)."""
    from scipy.stats import norm

    pick = _auto_pick(rows)
    if pick is None:
        return ""
    picked = [[pick(s) for s in r["seeds"]] for r in rows]
    out = []
    for split, limit in LOSS.items():
        per = [_deltas(r, g, split) for r, g in zip(rows, picked)]
        se = np.array([d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else np.nan for d in per])
        mean = np.array([d.mean() for d in per])
        group = [(r["table"], r["protocol"]) for r in rows]
        mu = {g: mean[[h == g for h in group]].mean() for g in set(group)}
        expected = sum(norm.cdf((-limit - mu[g]) / e) if e > 0 else float(mu[g] < -limit) for g, e in zip(group, se))
        out.append(f"{split}: median standard error of a configuration's mean {np.nanmedian(se):.2f} pp, losing "
                   f"configurations {int((mean < -limit).sum())} observed, {expected:.1f} expected from the seeds alone")
    return f"auto's noise ({len(rows[0]['seeds'])} seeds): " + "; ".join(out)


def per_config(rows) -> str:
    """Each configuration's Prox − Base under the auto rule (``AUTO``), mean over its seeds, and the settings picked."""
    pick = _auto_pick(rows)
    if pick is None:
        return ""
    lines = ["| table | protocol | outliers | seeds | outlier | inlier | overall | auto's picks |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e = effect([r], pick)
        chosen = ", ".join(str(SETTINGS[pick(s)]) for s in r["seeds"])
        lines.append(f"| {r['table']} | {r['protocol']} | {', '.join(r['outliers'])} | {len(r['seeds'])} | "
                     f"{e['outlier'][0]:+.2f} | {e['inlier'][0]:+.2f} | {e['overall'][0]:+.2f} | {chosen} |")
    return "\n".join(lines)


def losers(paths, routers=("km", "knn")) -> list:
    """The configurations (table, router, protocol, outliers) of saved runs that lose under their router's auto rule
    (more than 0.3 pp outlier or 0.5 pp inlier against Base, mean over the saved seeds): what ``--recheck`` re-runs;
    only those of ``routers`` (``--routers``)."""
    found = []
    for path in paths:
        rows = json.loads(Path(path).read_text())["rows"]
        for router in routers:
            sel = [r for r in rows if r["router"] == router]
            pick = _auto_pick(sel) if sel else None
            if sel and pick is None:
                raise SystemExit(f"{path}: saved without the {router} auto rule's CV curves or settings; cannot recheck")
            for r in sel:
                e = effect([r], pick)
                if e["lose_out"] or e["lose_in"]:
                    found.append((r["table"], router, r["protocol"], r["outliers"]))
    return found


def configurations(paths, routers=("km", "knn")) -> list:
    """Every configuration (table, router, protocol, outliers) of ``routers`` in saved runs, each once, in the order
    first met: what ``--rerun`` runs again on other ``--seeds``."""
    found = []
    for path in paths:
        for r in json.loads(Path(path).read_text())["rows"]:
            c = (r["table"], r["router"], r["protocol"], r["outliers"])
            if r["router"] in routers and c not in found:
                found.append(c)
    return found


def report(rows, detail: bool = False):
    for router in ("km", "knn"):
        sel = [r for r in rows if r["router"] == router]
        if not sel:
            continue
        print(f"\n{router}: {len(sel)} configurations x {len(sel[0]['seeds'])} seeds, Prox - Base on the test split")
        print(summarize(sel))
        if all("out_cv" in r["seeds"][0] for r in sel):
            print(cv_agreement(sel))
        if _auto_pick(sel) is not None:  # kNN's auto is a fixed setting: runs saved with --no-cv have it too
            print(noise(sel))
            print(f"\n{router}, by table and protocol:\n" + by_group(sel))
            if detail:
                print(f"\n{router}, per configuration:\n" + per_config(sel))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    p.add_argument("--from-json", default=None, help="only summarize saved runs (comma-separated JSON paths)")
    p.add_argument("--plot", default=None, help="with --from-json: a PNG of the main rules on each saved set")
    p.add_argument("--plot-groups", default=None, help="with --from-json: a PNG of auto against the fixed 1/tau per "
                   "table x protocol, all saved runs pooled")
    p.add_argument("--configs", choices=list(SETS), default="study",
                   help="out-of-sample: configurations this study never chose anything on; fresh: a third set, "
                   "never looked at before the parsimony rules were chosen; fresh2: a fourth, defined before the CV-spread rule; fresh3: a fifth, defined after shifted became the default; fresh4: a sixth, defined before the spread temperature became kNN's auto; fresh5: a seventh (KMeans only), defined before the ess-or-shifted rule was read off the others; fresh6: an eighth (KMeans only), defined before the capped rule of docs/prereg-km-cap20.md was tested; fresh7: a ninth (KMeans only, mostly BBH leave-task-out), defined before docs/prereg-km-cap20-ess-first.md was tested; fresh8: a tenth (KMeans only, mostly routerdc7), defined before docs/prereg-km-guard.md was tested; fresh9: an eleventh (KMeans, 10 seeds), defined before docs/prereg-km-task-local.md was tested; fresh10: a twelfth (KMeans, 10 seeds), defined before docs/prereg-km-plugin.md was tested; fresh11: a thirteenth, kNN on fresh5-fresh10 and routerbench's outlier pairs, a measurement pre-registered in docs/prereg-fresh11.md")
    p.add_argument("--routers", default="km,knn", choices=["km,knn", "km", "knn"], help="whose configurations to run")
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help=f"comma-separated seeds (default {SEEDS})")
    p.add_argument("--recheck", default=None, help="instead of --configs: the configurations of these saved runs "
                   "(comma-separated JSON paths) that lose under their router's auto rule, run again (give new --seeds)")
    p.add_argument("--rerun", default=None, help="instead of --configs: every configuration of these saved runs "
                   "(comma-separated JSON paths), each once, run again (give other --seeds)")
    p.add_argument("--per-config", action="store_true", help="also print each configuration's auto effect and picks")
    p.add_argument("--no-cv", action="store_true", help="fixed settings only (no CV curves, no auto rules)")
    p.add_argument("--cv-repeats", type=int, default=CV_REPEATS,
                   help=f"the CV's random splits averaged (default {CV_REPEATS}, as --inv-tau auto; 1 = one pass)")
    p.add_argument("--brier", action="store_true", help="also the Brier CV curves and rules")
    p.add_argument("--cv-fold-tasks", default="1", choices=["1", "2", "3", "4", "outliers"],
                   help="training tasks a CV fold holds out together; outliers: as many as the configuration has")
    a = p.parse_args(argv)
    if (a.plot or a.plot_groups) and not a.from_json:
        p.error("--plot and --plot-groups draw saved sets: give them with --from-json")
    if a.from_json:
        sets = {}
        for path in a.from_json.split(","):
            saved = json.loads(Path(path).read_text())
            print(f"\n# {path}: CV over {saved.get('cv_repeats', 1)} random split(s), "
                  f"{saved.get('cv_fold_tasks', '1')} task(s) held out per fold")  # saved before these options: 1, 1
            report(saved["rows"], a.per_config)
            sets[Path(path).stem.removeprefix("tau_sel_folds_").removeprefix("ess_")] = saved["rows"]
        if len(sets) > 1:
            pooled = [r for rows in sets.values() for r in rows]
            print(f"\n# the {len(sets)} saved runs pooled ({len(pooled)} configurations)")
            report(pooled, a.per_config)
        if a.plot:
            plot_sets(sets, a.plot)
        if a.plot_groups:
            plot_groups([r for rows in sets.values() for r in rows], a.plot_groups)
        return
    try:
        seed_values = [int(v) for v in a.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds {a.seeds!r}: allowed values are comma-separated integers")
    if a.recheck and a.rerun:
        p.error("--recheck and --rerun both choose the configurations: give one")
    routers = a.routers.split(",")
    configs = (losers(a.recheck.split(","), routers) if a.recheck
               else configurations(a.rerun.split(","), routers) if a.rerun else SETS[a.configs])
    enc = SentenceEncoder(progress=False)
    rows, cache = [], {}
    for name, router, protocol, outliers in configs:
        if router not in routers:
            continue
        if name not in cache:
            t = RoutingTable.read(D / f"{name}.parquet")
            cache[name] = (t, enc.encode(t.prompts), *t.matrices())
        table, X, acc, cost = cache[name]
        print(f"[tau] {name} {router} {protocol} {','.join(outliers)}", file=sys.stderr, flush=True)
        seeds = [run_config(table, X, acc, cost, router, protocol, outliers, s, cv=not a.no_cv, brier=a.brier,
                            repeats=a.cv_repeats, fold_tasks=a.cv_fold_tasks) for s in seed_values]
        rows.append({"table": name, "router": router, "protocol": protocol, "outliers": outliers, "seeds": seeds})
    if a.json:  # saved before the report, atomically: a report that fails loses no run
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(a.json, json.dumps({"settings": [str(g) for g in SETTINGS], "cv_repeats": a.cv_repeats,
                                               "cv_fold_tasks": a.cv_fold_tasks, "seeds": seed_values,
                                               "rows": rows}).encode())
    report(rows, a.per_config)


if __name__ == "__main__":
    main()
