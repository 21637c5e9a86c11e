"""The τ study's cross-validated rules and temperatures (research/tau/cv.py) on the routers' public steps."""
import numpy as np
import pytest


def test_estimates_over_fixed_relative_spread_and_mixed_temperatures():
    """tuning.estimates_over: a number is the router's own estimate at that 1/tau; rel:a and spr:a are the
    formula with phi scaled per query by its nearest distance / by the std of its distances; mix:a,b the
    mean of the weights at a and b."""
    from proxray import KNNRouter
    from cv import RELATIVE_FLOOR, estimates_over
    from proxray.routing.weights import proximity_weights

    rng = np.random.default_rng(3)
    X, acc = rng.normal(size=(120, 8)), rng.uniform(size=(120, 3))
    r = KNNRouter(k=15, temperature=7.0).fit(X, acc)
    Q = rng.normal(size=(6, 8))
    (fixed, _), (rel, _), (spr, _), (mix, _) = estimates_over(r, Q, [7.0, "rel:2", "spr:0.5", "mix:0,7"])
    assert np.allclose(fixed, r.estimate(Q)[0])
    phi, ref, _ = r.neighbourhood(Q)
    uniform = acc[ref].mean(axis=1)  # 1/tau = 0: the k neighbours' plain mean
    assert np.allclose(mix, (uniform + fixed) / 2) and not np.allclose(mix, fixed)
    for got, scale, a in ((rel, np.maximum(phi.min(1), RELATIVE_FLOOR), 2.0), (spr, phi.std(1), 0.5)):
        w = proximity_weights(phi / scale[:, None], a, None)
        want = np.einsum("qk,qkm->qm", w, acc[ref])
        assert np.allclose(got, want)


def test_brier_cv_scores_the_estimates_squared_error():
    """cv_curves(score="brier"): minus the mean squared error of the accuracy estimates, per 1/tau; the Base
    limit of kNN (1/tau = 0) is the neighbours' mean, which a sharper 1/tau does not equal."""
    from cv import brier_score, cv_curves

    assert brier_score([[0.5, 1.0]], [[0, 1]]) == pytest.approx(-12.5)
    rng = np.random.default_rng(11)
    tasks = np.repeat(np.array(["a", "b", "c"]), 40)
    X = rng.normal(size=(120, 6)) + (tasks[:, None] == "a") * 2.0
    acc = (rng.uniform(size=(120, 3)) < np.where(tasks[:, None] == "a", 0.8, 0.3)).astype(float)
    out, inl = cv_curves(X, acc, None, tasks, "knn", {"k": 20}, grid=(0.0, 5.0), score="brier")
    assert out.shape == inl.shape == (2,) and (out < 0).all() and (inl < 0).all() and out[0] != out[1]
    with pytest.raises(ValueError, match="score='auc'"):
        cv_curves(X, acc, None, tasks, "knn", {"k": 20}, score="auc")


@pytest.mark.parametrize("protocol", ["leave-task-out", "few-shot-outlier"])
def test_cv_folds_hold_out_whole_task_groups_over_repeated_splits(protocol, monkeypatch):
    """cv_curves(fold_tasks=, repeats=): each repeat partitions the eligible training tasks into groups of about
    fold_tasks (at least two); a fold trains on 80 % of the other tasks (plus, few-shot, at most few_shot shots
    drawn from the group's queries together), scores the group's other queries as outliers and the other 20 % as
    inliers; the scores are the mean over all folds of all repeats. One task of 5 queries is too small to hold out."""
    import cv as tuning

    rng = np.random.default_rng(3)
    tasks = np.concatenate([np.repeat(np.array(list("abcdef")), 30), np.repeat(np.array(["tiny"]), 5)])
    n = len(tasks)
    X = rng.normal(size=(n, 6))
    X[:, 0] = np.arange(n)  # the row's index rides along in its first coordinate
    acc = (rng.uniform(size=(n, 3)) < 0.5).astype(float)
    fits, scored = [], []
    real_make, real_est = tuning.make_router, tuning.estimates_over

    class Recorder:
        def __init__(self, r):
            self.r = r

        def fit(self, X, *a, **kw):
            fits.append(X[:, 0].astype(int))
            self.r.fit(X, *a, **kw)
            return self

    monkeypatch.setattr(tuning, "make_router", lambda *a, **kw: Recorder(real_make(*a, **kw)))
    monkeypatch.setattr(tuning, "estimates_over",
                        lambda fitted, Xv, grid: (scored.append(Xv[:, 0].astype(int)), real_est(fitted.r, Xv, grid))[1])
    out, inl = tuning.cv_curves(X, acc, None, tasks, "knn", {"k": 10}, protocol, few_shot=7, seed=1,
                                grid=(0.0, 2.0), fold_tasks=2, repeats=3)
    assert out.shape == inl.shape == (2,)
    assert len(fits) == 3 * 3 and len(scored) == 2 * len(fits)  # 6 tasks in 3 groups of 2, 3 repeats
    held_per_repeat = [[], [], []]
    for f, (train, out_val, in_val) in enumerate(zip(fits, scored[0::2], scored[1::2])):
        group = set(tasks[out_val])
        assert len(group) == 2 and "tiny" not in group
        shots = [i for i in train if tasks[i] in group]
        assert len(shots) == (7 if protocol == "few-shot-outlier" else 0)
        assert not set(train) & set(out_val) and not set(train) & set(in_val) and not set(in_val) & set(out_val)
        assert set(out_val) | set(shots) == set(np.flatnonzero(np.isin(tasks, list(group))))  # the whole group
        others = np.flatnonzero(~np.isin(tasks, list(group)))
        assert len(in_val) == len(others) - int(0.8 * len(others))  # 20 % of the others, the rest trains
        held_per_repeat[f // 3] += sorted(group)
    assert all(sorted(h) == list("abcdef") for h in held_per_repeat)  # each task held out once per repeat
    assert len({tuple(sorted(f)) for f in fits}) == len(fits)  # the repeats draw new splits
    one = tuning.cv_curves(X, acc, None, tasks, "knn", {"k": 10}, protocol, few_shot=7, seed=1, grid=(0.0, 2.0))
    assert not np.allclose(np.concatenate(one), np.concatenate([out, inl]))
    with pytest.raises(ValueError, match="fold_tasks=0: allowed values are integers >= 1"):
        tuning.cv_curves(X, acc, None, tasks, "knn", {"k": 10}, fold_tasks=0)
    with pytest.raises(ValueError, match="repeats=1.5: allowed values are integers >= 1"):
        tuning.cv_curves(X, acc, None, tasks, "knn", {"k": 10}, repeats=1.5)


def test_cv_default_is_one_task_per_fold_in_name_order(monkeypatch):
    """Without fold_tasks / repeats the CV holds out each eligible task once, in name order (the saved
    one-pass studies); auto_inv_tau averages CV_REPEATS passes by default."""
    import cv as tuning

    rng = np.random.default_rng(4)
    tasks = np.repeat(np.array(["c", "a", "b"]), 25)
    X, acc = rng.normal(size=(75, 5)), (rng.uniform(size=(75, 2)) < 0.5).astype(float)
    X[:, 0] = np.arange(75)
    held, calls = [], []
    real_est = tuning.estimates_over
    monkeypatch.setattr(tuning, "estimates_over", lambda f, Xv, grid: (held.append(Xv[:, 0].astype(int)), real_est(f, Xv, grid))[1])
    tuning.cv_curves(X, acc, None, tasks, "knn", {"k": 10}, grid=(0.0, 1.0))
    assert [sorted(set(tasks[h])) for h in held[0::2]] == [["a"], ["b"], ["c"]]
    real_cv = tuning.cv_folds
    monkeypatch.setattr(tuning, "cv_folds", lambda *a, **kw: (calls.append(kw.get("repeats")), real_cv(*a, **kw))[1])
    tuning.auto_inv_tau(X, acc, None, tasks, "knn", {"k": 10}, grid=(0.0, 1.0))
    assert calls == [tuning.CV_REPEATS] and tuning.CV_REPEATS == 3


def test_fold_rules_weigh_the_gain_over_base_by_its_spread_over_tasks():
    """select_inv_tau(rule="lcb"): the largest lower bound mean − se of the per-task gain over Base; "one-se":
    the 1/tau nearest Base whose mean is within one standard error of the best's. A large but erratic gain
    (1/tau = 5: +1 pp, tasks from −3 to +5) loses to a small steady one (2: +0.5 pp) under lcb, and one-se goes
    back to Base; the folds' repeats are averaged per task first."""
    from cv import CVFolds, select_inv_tau

    grid = (0.0, 2.0, 5.0)  # kNN: Base is 1/tau = 0
    gain = {"a": (0.6, 4.0), "b": (0.4, -3.0), "c": (0.5, 5.0), "d": (0.5, -2.0)}  # per task: gain at 2, at 5
    rows, groups = [], []
    for rep in (-0.25, 0.25):  # two repeats, each task's two folds differ by +-0.25 around its gain
        for t, (g2, g5) in gain.items():
            rows.append([70.0 + rep, 70.0 + g2 + rep, 70.0 + g5 - rep])
            groups.append((t,))
    folds = CVFolds(np.array(rows), np.array(rows), tuple(groups))
    np.testing.assert_allclose(folds.by_task()[:, 2] - 70.0, [4.0, -3.0, 5.0, -2.0])
    out, inl = folds.curves()
    assert select_inv_tau(out, inl, "knn", grid, "mean") == 5.0
    assert select_inv_tau(out, inl, "knn", grid, "lcb", folds=folds) == 2.0  # 0.5 - 0.04 > 0 > 1 - 2.04
    assert select_inv_tau(out, inl, "knn", grid, "lcb", folds=folds, se_mult=0.0) == 5.0  # mean gain alone
    assert select_inv_tau(out, inl, "knn", grid, "one-se", folds=folds) == 0.0  # Base within one se of 5's
    assert select_inv_tau(out, inl, "knn", grid, "one-se", folds=folds, se_mult=0.0) == 5.0
    with pytest.raises(ValueError, match="rule='lcb' reads the CV folds apart: pass folds="):
        select_inv_tau(out, inl, "knn", grid, "lcb")
    with pytest.raises(ValueError, match=r"grid=\[2.0, 5.0\]: must contain the Base limit \(0\)"):
        two = CVFolds(np.array(rows)[:, 1:], np.array(rows)[:, 1:], tuple(groups))
        select_inv_tau(out[1:], inl[1:], "knn", (2.0, 5.0), "lcb", folds=two)
    with pytest.raises(ValueError, match="the rule needs >= 2 tasks over the 3 settings"):
        select_inv_tau(out, inl, "knn", grid, "lcb", folds=CVFolds(np.array(rows[:1]), np.array(rows[:1]), (("a",),)))


def test_cv_folds_keep_the_folds_that_cv_curves_averages():
    """cv_folds: one row per fold (repeats x task groups), its groups the held-out tasks; cv_curves is the mean."""
    from cv import cv_curves, cv_folds

    rng = np.random.default_rng(3)
    tasks = np.repeat(np.array(["a", "b", "c"]), 30)
    X, acc = rng.normal(size=(90, 6)), (rng.uniform(size=(90, 2)) < 0.5).astype(float)
    folds = cv_folds(X, acc, None, tasks, "knn", {"k": 10}, grid=(0.0, 1.0, 5.0), repeats=2)
    assert folds.out.shape == folds.inl.shape == (6, 3)
    assert sorted(folds.groups) == [("a",), ("a",), ("b",), ("b",), ("c",), ("c",)]
    assert folds.by_task().shape == (3, 3)
    for got, want in zip(cv_curves(X, acc, None, tasks, "knn", {"k": 10}, grid=(0.0, 1.0, 5.0), repeats=2),
                         folds.curves()):
        np.testing.assert_array_equal(got, want)


def test_near_base_rule_takes_the_1_over_tau_nearest_base_within_tol():
    """select_inv_tau(rule="near-base"): among the 1/tau whose CV mean is within tol pp of the best, KMeans takes
    the largest (toward its Base limit inf), kNN the smallest (toward 0); tol 0 is the plain argmax."""
    from cv import GRID, select_inv_tau

    mean = np.array([70.0, 71.0, 71.5, 72.2, 72.5, 72.0, 71.6, 71.0, 70.5, 70.0])  # peak at 1/tau = 10
    out, inl = mean + 1.0, mean - 1.0
    assert select_inv_tau(out, inl, "km", GRID, "mean") == 10.0
    assert select_inv_tau(out, inl, "km", GRID, "near-base", tol=1.0) == 50.0  # 71.6 >= 72.5 - 1
    assert select_inv_tau(out, inl, "knn", GRID, "near-base", tol=1.0) == 2.0  # 71.5 >= 71.5
    assert select_inv_tau(out, inl, "km", GRID, "near-base", tol=0.0) == 10.0
    assert select_inv_tau(out, inl, "km", GRID, "near-base", tol=3.0) == float("inf")  # Base itself
    # shifted: the smoothed curve peaks at 10 too (72.23), then one grid step toward Base
    assert select_inv_tau(out, inl, "km", GRID, "shifted") == 20.0
    assert select_inv_tau(out, inl, "knn", GRID, "shifted") == 5.0
    rising = np.arange(10.0)  # peaks at the KMeans limit itself: the step stays there
    assert select_inv_tau(rising, rising, "km", GRID, "shifted") == float("inf")
    assert select_inv_tau(rising[::-1], rising[::-1], "knn", GRID, "shifted") == 0.0
    with pytest.raises(ValueError, match="rule 'shifted' smooths over grid neighbours and needs an ascending grid"):
        select_inv_tau(out[:3], inl[:3], "knn", (0.0, 5.0, 2.0), "shifted")
    assert select_inv_tau(out[:3], inl[:3], "knn", (0.0, 5.0, 2.0), "near-base", tol=1.0) == 2.0  # 5 and 2 qualify: by value
    with pytest.raises(ValueError, match="rule='best': allowed values are mean, guarded, near-base, shifted, lcb, one-se"):
        select_inv_tau(out, inl, "km", GRID, "best")


@pytest.mark.parametrize("kind", ["knn", "km"])
def test_ess_temperature_gives_every_query_the_same_effective_sample_size(kind, tmp_path):
    """temperature ESS(E): E is the effective sample size each query's weights get (kernels.ess_inv_tau), the same
    as estimates_over's ess:E; a Base router ignores it; an ESS below 1 or infinite is refused; proxray's artifacts
    do not take it (it does not ship): saving refers to the temperatures that do."""
    from proxray import KMeansRouter, KNNRouter
    from proxray.routing.registry import load_router
    from cv import ESS, estimates_over
    from proxray.routing.artifact import ArtifactError
    from proxray.routing.weights import effective_sample_size

    rng = np.random.default_rng(11)
    X, acc, cost = rng.normal(size=(160, 8)), rng.uniform(size=(160, 3)), rng.uniform(size=(160, 3))
    make = (lambda **kw: KNNRouter(k=25, **kw)) if kind == "knn" else (lambda **kw: KMeansRouter(n_clusters=10, **kw))
    r = make(temperature=ESS(3.0)).fit(X, acc, cost)
    Q = rng.normal(size=(9, 8)) * 3  # near and far queries alike
    np.testing.assert_allclose(effective_sample_size(r.weights(Q)[0]), 3.0, rtol=1e-6)
    assert np.allclose(r.estimate(Q)[0], next(estimates_over(make(temperature=20.0).fit(X, acc, cost), Q, ["ess:3"]))[0])
    acc_hat, cost_hat, outlier = r.estimate_with_outlier_score(Q)
    assert np.allclose(acc_hat, r.estimate(Q)[0]) and np.allclose(cost_hat, r.estimate(Q)[1])
    r.save(tmp_path / "a")
    with pytest.raises(ArtifactError, match="temperature='ess:3': expected a number"):
        load_router(tmp_path / "a")
    base = make(weighting="base", temperature=ESS(3.0)).fit(X, acc, cost)
    assert np.allclose(base.estimate(Q)[0], make(weighting="base").fit(X, acc, cost).estimate(Q)[0])
    for bad in (0.5, float("inf")):
        with pytest.raises(ValueError, match=f"inv_tau={bad!r} with temperature='ess'.*finite number >= 1"):
            make(temperature=ESS(bad)).fit(X, acc, cost)


def test_ess_or_shifted_takes_the_adaptive_bandwidth_only_past_the_margin():
    """select_ess_or_shifted: shifted's pick over the grid unless the last CV entry (ess:ESS_TARGET) is more than
    ESS_MARGIN pp above the CV mean at that pick (the pick's, not the curve's best); curves of the wrong length are refused."""
    from cv import ESS_MARGIN, ESS_TARGET, GRID, select_ess_or_shifted

    mean = np.array([70.0, 71.0, 71.5, 72.2, 72.5, 72.0, 71.6, 71.0, 70.5, 70.0])  # shifted picks 20 (72.0)
    for ess, want in ((72.0 + ESS_MARGIN + 0.01, (ESS_TARGET, "ess")),  # past the margin over the pick's 72.0 ...
                      (72.0 + ESS_MARGIN - 0.01, (20.0, "fixed")),  # ... not past it
                      (72.6, (ESS_TARGET, "ess"))):  # against the pick's 72.0, not the curve's best 72.5
        curve = np.append(mean, ess)
        assert select_ess_or_shifted(curve + 1.0, curve - 1.0) == want
    assert select_ess_or_shifted(np.append(mean, 72.3), np.append(mean, 72.3), margin=0.2) == (ESS_TARGET, "ess")
    with pytest.raises(ValueError, match=r"expected \(11,\), the 10 settings of the grid and then ess:3"):
        select_ess_or_shifted(mean, mean, GRID)


def test_ess_or_capped_stops_the_step_at_20_only_where_it_overshoots_a_clear_gain():
    """select_ess_or_shifted(cap=SHIFT_CAP) (rule "ess-or-capped"): a smoothed CV top at 1/tau = 20 that gains >=
    SHIFT_CAP_GAIN pp on Base keeps 20 where shifted steps to 50; a smaller gain, a top below 20 (the step lands at or
    before 20) and a top past 20 are shifted's own; the ess decision is made first, against the uncapped pick; a cap off
    the grid is refused."""
    from cv import ESS_TARGET, GRID, SHIFT_CAP, SHIFT_CAP_GAIN, select_ess_or_shifted

    assert SHIFT_CAP == 20.0 and SHIFT_CAP_GAIN == 0.5
    top20 = np.array([69.0, 69.5, 70.0, 70.6, 71.4, 71.6, 71.3, 70.8, 70.5, 70.4])  # smoothed top at 20, Base 70.4
    with_ess = lambda curve, ess: (np.append(curve, ess), np.append(curve, ess))  # noqa: E731
    assert select_ess_or_shifted(*with_ess(top20, 0.0)) == (50.0, "fixed")  # ess-or-shifted: one step past the top
    assert select_ess_or_shifted(*with_ess(top20, 0.0), cap=SHIFT_CAP) == (20.0, "fixed")  # gain 1.2 pp: stays at 20
    small = top20.copy()
    small[-1] = top20[5] - SHIFT_CAP_GAIN + 0.01  # the top gains just under 0.5 pp on Base
    assert select_ess_or_shifted(*with_ess(small, 0.0), cap=SHIFT_CAP) == (50.0, "fixed")
    top10 = np.array([69.0, 69.5, 70.0, 71.0, 71.8, 71.5, 70.9, 70.8, 70.5, 70.4])  # smoothed top at 10: step to 20
    assert select_ess_or_shifted(*with_ess(top10, 0.0), cap=SHIFT_CAP) == (20.0, "fixed")
    top50 = np.array([69.0, 69.5, 70.0, 70.2, 70.6, 71.2, 71.6, 71.3, 70.5, 70.4])  # smoothed top at 50: step to 100
    assert select_ess_or_shifted(*with_ess(top50, 0.0), cap=SHIFT_CAP) == (100.0, "fixed")
    # ess 3 clears the margin over the uncapped pick's CV mean (50: 71.3) though not over the cap's (20: 71.6)
    assert select_ess_or_shifted(*with_ess(top20, 71.9), cap=SHIFT_CAP) == (ESS_TARGET, "ess")
    with pytest.raises(ValueError, match=r"cap=30\.0: must be a value of the grid"):
        select_ess_or_shifted(*with_ess(top20, 0.0), GRID, cap=30.0)
