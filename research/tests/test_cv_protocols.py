"""The τ study's CV rules run through the product's protocols (``run_once``'s temperature hook, ``cv.chooser``)."""
import numpy as np
import pytest

import cv as tuning
from cv import GRID, auto_inv_tau, chooser
from proxray.pool.simulated import make_table
from proxray.experiments.protocols import protocol_split


@pytest.fixture(scope="module")
def synth(encoder):
    t = make_table(60, seed=0)
    acc, cost = t.matrices()
    return t, encoder.encode(t.prompts), acc, cost


def number(spec: str) -> float:
    """The number of a temperature spec ("fixed:20" -> 20.0)."""
    return float(spec.partition(":")[2])


@pytest.mark.slow
def test_auto_tau_uses_training_data_only(synth):
    """Through the real protocol entry point (``run_once``): corrupting the test split and the outlier tasks
    (flipped labels, shuffled embeddings, tenfold costs) leaves the CV's chosen 1/tau as it is — and the same
    corruption does move the choice of a selection that reads those rows, so the check can fail. (KMeans' default
    auto, the plug-in temperature, chooses nothing before fitting: its per-query 1/tau reads the fitted router's
    clusters, which the training rows alone make; the CV rules remain options.)"""
    from proxray.experiments.protocols import run_once

    t, X, acc, cost = synth
    kw = dict(router="km", protocol="leave-task-out", outliers=["medqa", "hellaswag"], n_clusters=16,
              temperature=chooser("ess-or-capped"))
    sp = protocol_split(t.tasks, kw["outliers"], kw["protocol"], seed=42)
    unseen = np.setdiff1d(np.arange(len(X)), sp.base_train)  # the test split and every unseen outlier row
    assert set(sp.test) <= set(unseen) and np.isin(t.tasks[unseen], kw["outliers"]).any()
    rng = np.random.default_rng(0)
    X2, acc2, cost2 = X.copy(), acc.copy(), cost.copy()
    acc2[unseen] = 1 - acc2[unseen]
    X2[unseen] = X2[rng.permutation(unseen)]
    cost2[unseen] *= 10
    clean = run_once(X, acc, cost, t.tasks, seed=42, **kw)["temperature"]
    assert run_once(X2, acc2, cost2, t.tasks, seed=42, **kw)["temperature"] == clean
    hp = {"n_clusters": 16, "k": 100, "random_state": 42}
    leaky = np.concatenate([sp.base_train, sp.test])  # what a leaking selection would read

    def chosen(X_, a_, c_):
        return auto_inv_tau(X_[leaky], a_[leaky], c_[leaky], t.tasks[leaky], "km", hp, seed=42)[0]

    assert chosen(X2, acc2, cost2) != chosen(X, acc, cost)
    _, scores = auto_inv_tau(X[sp.base_train], acc[sp.base_train], cost[sp.base_train], t.tasks[sp.base_train],
                             "km", hp, seed=42)
    means = [(o + i) / 2 for o, i in scores.values()]
    assert max(means) - min(means) > 0.5  # the CV scores really depend on tau (the choice is not a constant)


@pytest.mark.slow
def test_run_once_passes_cv_repeats_and_rule_to_auto(synth, monkeypatch):
    """run_once's auto with a CV rule uses CV_REPEATS passes; KMeans' "ess-or-capped" (its default before the
    plug-in): one CV over the fixed grid and ess:3, resolved by select_ess_or_shifted with cap=SHIFT_CAP (so a fixed
    choice is shifted's own, or the cap where shifted's step passed it); cv_repeats / cv_rule say otherwise
    ("ess-or-shifted": the same CV, no cap); near-base and shifted never pick a smoother KMeans 1/tau than mean does
    here (they move toward inf; shifted from the smoothed curve's argmax, which can sit one step below mean's)."""
    import proxray.experiments.protocols as ex

    t, X, acc, cost = synth
    folds, rules = [], []
    real_folds, real_auto = tuning.cv_folds, tuning.auto_inv_tau
    monkeypatch.setattr(tuning, "cv_folds",
                        lambda *a, **kw: (folds.append((kw["repeats"], len(a[9]))), real_folds(*a, **kw))[1])
    monkeypatch.setattr(tuning, "auto_inv_tau", lambda *a, **kw: (rules.append(kw["rule"]), real_auto(*a, **kw))[1])
    kw = dict(router="km", protocol="leave-task-out", outliers=["medqa", "hellaswag"], n_clusters=16)
    def run(rule, repeats=None):
        return ex.run_once(X, acc, cost, t.tasks, seed=42, temperature=chooser(rule, repeats), **kw)["temperature"]

    auto = run("ess-or-capped")
    run("ess-or-capped", repeats=1)
    shifted, mean, near = (number(run(rule)) for rule in ("shifted", "mean", "near-base"))
    lcb = number(run("lcb"))  # reads the folds apart
    assert folds == [(3, len(GRID) + 1), (1, len(GRID) + 1)] + [(3, len(GRID))] * 4
    assert rules == ["shifted", "mean", "near-base", "lcb"]
    assert near >= mean and shifted >= mean and lcb in GRID
    assert auto.startswith("ess:") or number(auto) in (shifted, tuning.SHIFT_CAP)
    sp = protocol_split(t.tasks, kw["outliers"], kw["protocol"], 42)
    got = tuning.auto_choice(X[sp.base_train], acc[sp.base_train], cost[sp.base_train], t.tasks[sp.base_train], "km",
                             {"n_clusters": 16, "random_state": 42}, seed=42, rule="ess-or-capped")
    assert got.rule == "ess-or-capped" and tuning.as_temperature(got.inv_tau, got.temperature).spec == auto
    assert list(got.curves)[-1] == "ess:3"
    out_cv, in_cv = np.array(list(got.curves.values())).T
    assert tuning.select_ess_or_shifted(out_cv, in_cv, cap=tuning.SHIFT_CAP) == (got.inv_tau, got.temperature)
    assert run("ess-or-shifted") == tuning.as_temperature(*tuning.select_ess_or_shifted(out_cv, in_cv)).spec


def test_a_rule_for_one_router_is_refused_for_the_other():
    with pytest.raises(ValueError, match="rule='spread'.*kNN only.*allowed: mean, guarded, near-base, shifted"):
        tuning.check_rule("spread", "km")
