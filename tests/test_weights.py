import numpy as np
import pytest

from proxray.weights import effective_sample_size, proximity_weights, resolve_inv_tau


def test_rows_sum_to_one_and_match_formula(rng):
    phi = rng.uniform(0, 1, size=(5, 7))
    prior = rng.uniform(0.1, 2.0, size=7)
    w = proximity_weights(phi, 20.0, prior)
    expected = prior * np.exp(-20.0 * phi)
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(w, expected, rtol=1e-12)
    np.testing.assert_allclose(w.sum(1), 1.0)


def test_tau_to_zero_is_hard_nearest(rng):
    phi = rng.uniform(0, 1, size=(50, 9))
    w = proximity_weights(phi, np.inf, rng.uniform(0.1, 1, size=9))
    np.testing.assert_array_equal(np.argmax(w, 1), np.argmin(phi, 1))
    np.testing.assert_array_equal(w.max(1), 1.0)
    # a very large finite inv_tau converges to the same limit, stably (log space, no overflow)
    w_big = proximity_weights(phi, 1e9)
    assert np.isfinite(w_big).all()
    np.testing.assert_allclose(w_big, w, atol=1e-12)


def test_tau_to_infinity_is_the_prior(rng):
    phi = rng.uniform(0, 2, size=(4, 6))
    prior = np.array([1, 2, 3, 4, 5, 6.0])
    np.testing.assert_allclose(proximity_weights(phi, 0.0, prior), np.tile(prior / prior.sum(), (4, 1)))
    np.testing.assert_allclose(proximity_weights(phi, 0.0), np.full((4, 6), 1 / 6))


def test_hard_limit_ties_split_by_prior():
    phi = np.array([[0.2, 0.2, 0.5]])
    w = proximity_weights(phi, np.inf, np.array([1.0, 3.0, 10.0]))
    np.testing.assert_allclose(w, [[0.25, 0.75, 0.0]])


def test_zero_distance_is_finite_and_dominates():
    phi = np.array([[0.0, 0.0, 0.3], [0.0, 1e-9, 2.0]])
    w = proximity_weights(phi, 20.0)
    assert np.isfinite(w).all()
    np.testing.assert_allclose(w.sum(1), 1.0)
    np.testing.assert_allclose(w[0, 0], w[0, 1])
    assert w[0, 2] == pytest.approx(np.exp(-6) / (2 + np.exp(-6)))


def test_absent_elements_get_zero_weight_for_every_tau():
    phi = np.array([[0.1, np.inf, 0.3]])
    for inv_tau in (0.0, 1.0, 20.0, np.inf):
        w = proximity_weights(phi, inv_tau)
        assert w[0, 1] == 0.0 and np.isfinite(w).all()
        np.testing.assert_allclose(w.sum(), 1.0)
    w = proximity_weights(np.array([[0.1, 0.2]]), 5.0, np.array([0.0, 1.0]))
    np.testing.assert_allclose(w, [[0.0, 1.0]])


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="NaN"):
        proximity_weights(np.array([[0.1, np.nan]]), 1.0)
    with pytest.raises(ValueError, match="row 1 has no reference"):
        proximity_weights(np.array([[0.1, 0.2], [np.inf, np.inf]]), 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        proximity_weights(np.array([[0.1, 0.2]]), 1.0, np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="inv_tau"):
        proximity_weights(np.array([[0.1]]), -1.0)
    with pytest.raises(ValueError, match="shape"):
        proximity_weights(np.array([0.1, 0.2]), 1.0)


def test_resolve_inv_tau():
    assert resolve_inv_tau(20.0) == 20.0
    assert resolve_inv_tau(tau=0.05) == pytest.approx(20.0)
    assert resolve_inv_tau(tau=0) == np.inf
    assert resolve_inv_tau(tau=np.inf) == 0.0
    with pytest.raises(ValueError, match="tau"):
        resolve_inv_tau(tau=-1)
    with pytest.raises(ValueError, match="auto"):
        resolve_inv_tau("auto")


def test_effective_sample_size():
    np.testing.assert_allclose(effective_sample_size(np.full((1, 10), 0.1)), [10.0])
    np.testing.assert_allclose(effective_sample_size(np.array([[1.0, 0, 0]])), [1.0])


def test_ess_inv_tau_gives_each_query_the_target_effective_sample_size(rng):
    """weights.ess_inv_tau: per query the 1/tau at which the formula's weights have Kish ESS = target; a larger
    target is a smaller 1/tau; a per-row shift of the distances changes nothing; absent elements stay at 0."""
    from proxray.weights import ESS_LOG_RANGE, ess_inv_tau

    phi = rng.uniform(0.2, 1.4, size=(40, 16))
    phi[3, [2, 9]] = np.inf
    prior = rng.uniform(0.2, 3.0, size=16)
    taus = {}
    for target in (1.5, 3.0, 7.0):
        t = taus[target] = ess_inv_tau(phi, prior, target)
        w = proximity_weights(phi * t[:, None], 1.0, prior)
        np.testing.assert_allclose(effective_sample_size(w), target, rtol=1e-6)
        assert (w[3, [2, 9]] == 0).all()
        np.testing.assert_allclose(ess_inv_tau(phi + rng.uniform(0, 5, size=(40, 1)), prior, target), t, rtol=1e-9)
    assert (taus[1.5] > taus[3.0]).all() and (taus[3.0] > taus[7.0]).all()
    # a prior whose own ESS is below the target: as flat as the range allows (the low end, nearly the prior)
    skewed = np.array([100.0, 1.0, 1.0, 1.0])
    low = ess_inv_tau(np.array([[0.1, 0.2, 0.3, 0.4]]), skewed, 3.0)
    assert low[0] == pytest.approx(np.exp(ESS_LOG_RANGE[0]), rel=1e-6)
    with pytest.raises(ValueError, match="target=0.5: an effective sample size must be >= 1"):
        ess_inv_tau(phi, prior, 0.5)


def test_tilted_weights_is_the_formula_at_each_temperature(rng):
    """tilted_weights: "fixed" is proximity_weights as given; "spread" tilts phi / std(phi(x)) (so a row's weights do
    not change when its distances are scaled); "ess" gives every row the target effective sample size; anything
    else is refused by name."""
    from proxray.weights import tilted_weights

    phi, prior = rng.random((5, 12)), rng.random(12) + 0.1
    np.testing.assert_allclose(tilted_weights(phi, 7.0, prior), proximity_weights(phi, 7.0, prior))
    std = phi.std(axis=1, keepdims=True)
    np.testing.assert_allclose(tilted_weights(phi, 2.0, prior, "spread"), proximity_weights(phi / std, 2.0, prior))
    np.testing.assert_allclose(tilted_weights(3 * phi, 2.0, prior, "spread"), tilted_weights(phi, 2.0, prior, "spread"))
    np.testing.assert_allclose(effective_sample_size(tilted_weights(phi, 3.0, prior, "ess")), 3.0, rtol=1e-6)
    with pytest.raises(ValueError, match="temperature='cold': allowed values are fixed, spread, ess"):
        tilted_weights(phi, 1.0, prior, "cold")
