"""The τ study's own kernels (research/tau/kernels.py): the earlier 1/tau spelling, the adaptive bandwidth and the
one switch over every temperature the study measured."""
import numpy as np
import pytest

from proxray.routing.weights import effective_sample_size, proximity_weights
from kernels import ESS_LOG_RANGE, ess_inv_tau, resolve_inv_tau, tilted_weights


def test_resolve_inv_tau():
    assert resolve_inv_tau(20.0) == 20.0
    assert resolve_inv_tau(tau=0.05) == pytest.approx(20.0)
    assert resolve_inv_tau(tau=0) == np.inf
    assert resolve_inv_tau(tau=np.inf) == 0.0
    with pytest.raises(ValueError, match="tau"):
        resolve_inv_tau(tau=-1)
    with pytest.raises(ValueError, match="auto"):
        resolve_inv_tau("auto")


def test_ess_inv_tau_gives_each_query_the_target_effective_sample_size(rng):
    """weights.ess_inv_tau: per query the 1/tau at which the formula's weights have Kish ESS = target; a larger
    target is a smaller 1/tau; a per-row shift of the distances changes nothing; absent elements stay at 0."""
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
    phi, prior = rng.random((5, 12)), rng.random(12) + 0.1
    np.testing.assert_allclose(tilted_weights(phi, 7.0, prior), proximity_weights(phi, 7.0, prior))
    std = phi.std(axis=1, keepdims=True)
    np.testing.assert_allclose(tilted_weights(phi, 2.0, prior, "spread"), proximity_weights(phi / std, 2.0, prior))
    np.testing.assert_allclose(tilted_weights(3 * phi, 2.0, prior, "spread"), tilted_weights(phi, 2.0, prior, "spread"))
    np.testing.assert_allclose(effective_sample_size(tilted_weights(phi, 3.0, prior, "ess")), 3.0, rtol=1e-6)
    with pytest.raises(ValueError, match="temperature='cold': allowed values are fixed, spread, ess"):
        tilted_weights(phi, 1.0, prior, "cold")


