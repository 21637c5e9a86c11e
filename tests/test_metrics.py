import numpy as np
import pytest

from proxray.experiments.metrics import (apgr, baseline_points, cpt, lambda_grid, ndch_auc, operating_points, pgr_curve,
                             routing_match, sweep, topz_jaccard, topz_sets, upper_hull)


@pytest.mark.parametrize("points,expected", [
    ([(1, 0.5), (3, 0.9)], 70.0),                        # one straight segment
    ([(1, 0.5), (2, 0.6), (3, 0.9)], 70.0),              # a point under the chord is not on the hull
    ([(1, 0.5), (2, 0.8), (3, 0.9)], 75.0),              # a point above the chord lifts the curve
    ([(1, 0.5), (3, 0.9), (2.5, 0.4), (4, 0.4)], 70.0),  # dominated points change nothing
    ([(1, 0.5), (2, 0.8)], 72.5),                        # flat right of the most accurate point
    ([(2, 0.8), (3, 0.9)], 42.5),                        # zero left of the cheapest point
    ([(1, 0.5), (5, 0.9)], 60.0),                        # clipped at c_max
    ([(0, 0.3), (1, 0.5), (3, 0.9)], 70.0),              # cheaper than c_min: only its segment inside counts
])
def test_ndch_auc_on_hand_made_curves(points, expected):
    assert ndch_auc(points, 1.0, 3.0) == pytest.approx(expected)


def test_upper_hull_is_non_decreasing_and_concave():
    pts = np.array([(0, 0.1), (1, 0.6), (2, 0.62), (3, 0.9), (4, 0.5), (3, 0.2)])
    H = upper_hull(pts)
    assert (np.diff(H[:, 1]) > 0).all()
    slopes = np.diff(H[:, 1]) / np.diff(H[:, 0])
    assert (np.diff(slopes) <= 0).all()
    np.testing.assert_allclose(H, [(0, 0.1), (1, 0.6), (3, 0.9)])


def test_empty_cost_range_is_an_error():
    with pytest.raises(ValueError, match="cost range"):
        ndch_auc([(1, 0.5)], 2.0, 2.0)


def test_oracle_dominates_every_single_model(rng):
    acc = (rng.uniform(size=(300, 4)) < [0.3, 0.5, 0.6, 0.8]).astype(float)
    cost = np.tile([1.0, 2.0, 4.0, 8.0], (300, 1))
    b = baseline_points(acc, cost, largest=3)
    c_min, c_max = 1.0, 8.0
    oracle = ndch_auc(b["oracle"], c_min, c_max)
    assert oracle > ndch_auc(b["singles"], c_min, c_max) > ndch_auc(b["random"], c_min, c_max)
    np.testing.assert_allclose(b["largest"], [[1.0, acc[:, 0].mean()], [8.0, acc[:, 3].mean()]])
    # the cheapest-largest mix: a straight line between the two single models
    assert ndch_auc(b["largest"], c_min, c_max) == pytest.approx(100 * (acc[:, 0].mean() + acc[:, 3].mean()) / 2)
    np.testing.assert_allclose(b["random"], [[3.75, acc.mean()]])


def test_sweep_with_true_values_is_the_oracle(rng):
    acc = (rng.uniform(size=(200, 3)) < [0.3, 0.6, 0.9]).astype(float)
    cost = np.tile([1.0, 3.0, 9.0], (200, 1))
    lams, choices, pts = sweep(acc, cost, acc, cost)
    assert len(lams) == len(lambda_grid(cost)) == len(pts)
    assert pts[0, 1] == pytest.approx(acc.max(1).mean())      # λ = 0: best accuracy
    assert pts[-1, 0] == pytest.approx(1.0)                      # largest λ: cheapest model
    np.testing.assert_allclose(operating_points(choices[:1], acc, cost), pts[:1])


def test_apgr_and_cpt():
    frac = np.array([0.5])
    assert apgr(frac, np.array([1.0])) == pytest.approx(0.75)
    f = np.linspace(0, 1, 11)
    assert apgr(f, f) == pytest.approx(0.5)                      # random routing recovers half
    assert cpt(f, f, 0.5) == pytest.approx(0.5)
    assert cpt(f, f * 0.1, 0.5) == 1.0


def test_pgr_curve(rng):
    acc = np.array([[0, 1], [0, 1], [1, 1], [0, 0]], float)
    choices = np.array([[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    frac, pgr = pgr_curve(choices, acc, weak=0, strong=1)
    np.testing.assert_allclose(frac, [0, 0.5, 1])
    np.testing.assert_allclose(pgr, [0, 1, 1])


def test_routing_match():
    acc = np.array([[1, 0.5, 0], [0, 1, 0.9], [0.2, 0.1, 0.0]])
    choice = np.array([0, 2, 2])
    m = routing_match(choice, acc, None, z=(1, 2, 3))
    assert m == {1: pytest.approx(1 / 3), 2: pytest.approx(2 / 3), 3: 1.0}


def test_topz_jaccard():
    # task a prefers models 0,1; task b prefers 1,2; task c prefers 0,1
    acc = np.array([[1, 0.9, 0], [0, 0.9, 1], [1, 0.8, 0.1]])
    tasks = np.array(["a", "b", "c"])
    sets = topz_sets(acc, None, tasks, z=2)
    assert sets == {"a": {0, 1}, "b": {1, 2}, "c": {0, 1}}
    # outlier b vs inliers a and c: |{1}| / |{0,1,2}| each
    assert topz_jaccard(acc, None, tasks, outliers=["b"], z=2) == pytest.approx(1 / 3)
    assert topz_jaccard(acc, None, tasks, outliers=["c"], z=2) == pytest.approx((1 + 1 / 3) / 2)
