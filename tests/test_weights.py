import numpy as np
import pytest

from proxray.routing.weights import effective_sample_size, proximity_weights


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


def test_effective_sample_size():
    np.testing.assert_allclose(effective_sample_size(np.full((1, 10), 0.1)), [10.0])
    np.testing.assert_allclose(effective_sample_size(np.array([[1.0, 0, 0]])), [1.0])


def test_bias_variance_stats_is_its_formula(rng):
    """weights.bias_variance_stats: var_i = mean_m V_im (1 − V_im) / n_i; L² by least squares through the origin
    of mean_m (V_im − V_jm)² − var_i − var_j on d_ij² over the pairs i < j, floored at 0."""
    from proxray.routing.weights import bias_variance_stats

    V, n = rng.uniform(size=(6, 4)), rng.integers(1, 50, size=6).astype(float)
    D = rng.uniform(0.1, 1.0, size=(6, 6))
    D = (D + D.T) / 2
    np.fill_diagonal(D, 0.0)
    var, l2 = bias_variance_stats(V, n, D)
    np.testing.assert_allclose(var, [np.mean(V[i] * (1 - V[i])) / n[i] for i in range(6)], rtol=1e-12)
    num = den = 0.0
    for i in range(6):
        for j in range(i + 1, 6):
            y = np.mean((V[i] - V[j]) ** 2) - var[i] - var[j]
            num, den = num + y * D[i, j] ** 2, den + D[i, j] ** 4
    assert l2 == pytest.approx(max(num / den, 0.0), rel=1e-12)
    same = np.tile(V[:1], (6, 1))  # one accuracy everywhere: nothing to gain from proximity
    assert bias_variance_stats(same, n, D)[1] == 0.0
    assert bias_variance_stats(V[:1], n[:1], D[:1, :1])[1] == 0.0  # one cluster: no pair


def test_bias_variance_stats_local_fits_the_near_pairs_only(rng):
    """neighbours=m (the local-Lipschitz ablation): the same least squares over the pairs where one cluster is among
    the other's m nearest; every cluster its neighbour is all pairs; a step between two groups of clusters, invisible
    to the near pairs, gives L² 0 locally and > 0 over all pairs."""
    from proxray.routing.weights import bias_variance_stats

    V, n = rng.uniform(size=(6, 4)), rng.integers(1, 50, size=6).astype(float)
    D = rng.uniform(0.1, 1.0, size=(6, 6))
    D = (D + D.T) / 2
    np.fill_diagonal(D, 0.0)
    (var_all, l2_all), (var5, l2_5) = bias_variance_stats(V, n, D), bias_variance_stats(V, n, D, neighbours=5)
    assert l2_5 == l2_all and np.array_equal(var5, var_all)
    var, l2 = bias_variance_stats(V, n, D, neighbours=1)
    nearest = [int(np.argmin(np.where(np.arange(6) == i, np.inf, D[i]))) for i in range(6)]
    pairs = {tuple(sorted((i, j))) for i, j in enumerate(nearest)}
    num = sum((np.mean((V[i] - V[j]) ** 2) - var[i] - var[j]) * D[i, j] ** 2 for i, j in pairs)
    assert l2 == pytest.approx(max(num / sum(D[i, j] ** 4 for i, j in pairs), 0.0), rel=1e-12)
    x = np.array([0.0, 0.1, 0.2, 5.0, 5.1, 5.2])  # two tight groups far apart, the accuracy a step between them
    step = np.repeat([[0.2], [0.8]], 3, axis=0) * np.ones((1, 4))
    big = np.full(6, 1e9)  # no sampling noise
    assert bias_variance_stats(step, big, np.abs(x[:, None] - x[None, :]), neighbours=2)[1] == 0.0
    assert bias_variance_stats(step, big, np.abs(x[:, None] - x[None, :]))[1] > 0.0
    for bad in (0, 1.5, -2):
        with pytest.raises(ValueError, match=f"neighbours={bad!r}: a whole number"):
            bias_variance_stats(V, n, D, neighbours=bad)


def test_bias_variance_weights_are_proximity_weights_at_each_grid_point(rng, monkeypatch):
    """weights.bias_variance_weights evaluates the whole BV_GRID per block of queries: the weights it returns are
    bitwise proximity_weights at the chosen 1/tau, the choice the sequential scan's (strictly lower by 1e-15, ties
    to the smoother), for several c at once, with absent elements (phi = inf, prior 0) and across block edges."""
    from proxray.routing import weights
    from proxray.routing.weights import BV_GRID, bias_variance_weights

    phi, prior = rng.uniform(0.2, 1.2, size=(23, 7)), rng.uniform(0.2, 3.0, size=7)
    phi[3, 2] = phi[10, :6] = np.inf
    prior[4] = 0.0
    var, l2, cs = rng.uniform(1e-4, 5e-3, size=7), 0.1, (0.0, 0.125, 1.0)
    grid = [proximity_weights(phi, g, prior) for g in BV_GRID]
    finite = np.where(np.isfinite(phi), phi, 0.0)
    want = []
    for c in cs:
        low, pick = np.full(len(phi), np.inf), np.zeros(len(phi), dtype=int)
        for g, w in enumerate(grid):
            s = (w ** 2 * var).sum(1) + c * l2 * np.square((w * finite).sum(1))
            pick, low = np.where(s < low - 1e-15, g, pick), np.where(s < low - 1e-15, s, low)
        want.append((BV_GRID[pick], np.stack([grid[g][q] for q, g in enumerate(pick)])))
    for chunk in (weights.BV_CHUNK, len(BV_GRID) * 7 * 5, 1):  # one block; blocks of 5 queries; one query each
        monkeypatch.setattr(weights, "BV_CHUNK", chunk)
        got = bias_variance_weights(phi, prior, var, l2, cs)
        for (t, w), (want_t, want_w) in zip(got, want):
            np.testing.assert_array_equal(t, want_t)
            np.testing.assert_array_equal(w, want_w)
    assert len(np.unique(want[1][0])) > 1 and (want[2][0] >= want[0][0]).all()
    # a variance per query and element (bench/knn_plugin.py's neighbours): the same scan, row by row
    rows = rng.uniform(0.5, 2.0, size=(23, 1)) * var
    t, w = bias_variance_weights(phi, prior, rows, l2, cs)[1]
    for q in range(len(phi)):
        one_t, one_w = bias_variance_weights(phi[q:q + 1], prior, rows[q], l2, cs)[1]
        assert t[q] == one_t[0] and np.array_equal(w[q], one_w[0])
    assert not np.array_equal(t, want[1][0])  # the rows' own variances move some picks


def test_bias_variance_inv_tau_minimizes_the_bound_and_sharpens_with_the_bias_weight(rng):
    """weights.bias_variance_inv_tau: per query the 1/tau of BV_GRID minimizing Σ w² var + c·L²·(Σ w φ)² (brute
    force); a larger bias weight never smooths (Σ w φ falls as 1/tau grows); no bias (L² = 0) with the least-variance
    prior gives the prior, no variance the nearest cluster; the PlugIn temperature's weights are the formula at the
    chosen 1/tau."""
    from proxray.routing.temperature import PlugIn
    from proxray.routing.weights import BV_GRID, bias_variance_inv_tau

    def plug_in(c, stats):
        return PlugIn(c).weights(phi, prior, type("Clusters", (), {"bias_variance_stats": lambda self: stats})())

    phi, prior = rng.uniform(0.2, 1.2, size=(30, 12)), rng.uniform(0.2, 3.0, size=12)
    var, l2 = rng.uniform(1e-4, 5e-3, size=12), 0.1
    for c in (0.125, 1.0):
        t = bias_variance_inv_tau(phi, prior, var, l2, c)
        for q in range(len(phi)):
            scores = [np.sum(proximity_weights(phi[q:q + 1], g, prior)[0] ** 2 * var)
                      + c * l2 * np.sum(proximity_weights(phi[q:q + 1], g, prior)[0] * phi[q]) ** 2 for g in BV_GRID]
            assert scores[list(BV_GRID).index(t[q])] <= min(scores) * (1 + 1e-9)  # the minimum, up to rounding
    low, high = (bias_variance_inv_tau(phi, prior, var, l2, c) for c in (0.01, 4.0))
    assert (high >= low).all() and (high > low).any()
    # no bias and the least-variance prior (p_i ∝ 1 / var_i): the prior itself
    assert (bias_variance_inv_tau(phi, prior, 1e-3 / prior, 0.0, 1.0) == 0.0).all()
    nearest = plug_in(1.0, (np.zeros(12), l2))  # no variance: the nearest cluster, to rounding
    np.testing.assert_allclose(nearest, proximity_weights(phi, np.inf, prior), atol=1e-9)
    w = plug_in(0.125, (var, l2))
    t = bias_variance_inv_tau(phi, prior, var, l2, 0.125)
    np.testing.assert_allclose(w, np.vstack([proximity_weights(phi[q:q + 1], t[q], prior) for q in range(30)]))
    with pytest.raises(ValueError, match="one variance per reference element"):
        bias_variance_inv_tau(phi, prior, var[:5], l2, 1.0)
    with pytest.raises(ValueError, match="must be finite numbers >= 0"):
        bias_variance_inv_tau(phi, prior, var, l2, -1.0)
