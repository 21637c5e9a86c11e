"""The ProxRouter weight formula, in one place (paper eq. 4 and appendix D).

    w_i(x) = p_i · exp(-phi_i(x) · inv_tau) / Σ_j p_j · exp(-phi_j(x) · inv_tau)

Every router in proxray (KMeans and kNN, Base and Prox) computes its weights here; there is no
other kernel. Base routers are the two limits of the same formula:

* ``inv_tau = inf`` (tau → 0): all weight on the nearest reference element(s) — the classic
  nearest-cluster KMeans router. Ties share the weight in proportion to the prior, which is the
  exact limit of the formula.
* ``inv_tau = 0`` (tau → ∞): the weights are the prior — with a uniform prior over the k nearest
  neighbours, the classic uniform kNN router.

Conventions the callers rely on:

* ``phi = +inf`` marks a reference element that is absent (e.g. faiss returned fewer than k
  neighbours); it gets weight 0 for every ``inv_tau``, including 0 (where ``0 · inf`` would be NaN).
* ``prior = 0`` likewise excludes an element.
* A zero distance is an ordinary value here (``exp(0) = 1``): unlike 1/d weighting there is no
  singularity, so an exact duplicate of a training query simply gets the largest weight.
* NaN distances or priors, negative priors, or a row with nothing left to weigh are errors.
"""
from __future__ import annotations

import numpy as np

__all__ = ["proximity_weights", "effective_sample_size", "spread_scaled", "bias_variance_stats",
           "bias_variance_inv_tau", "bias_variance_weights"]

def spread_scaled(phi) -> np.ndarray:
    """``phi`` in units of each query's own spread: phi / std(phi(x)) over the row's present (finite)
    elements, the std floored at 1e-3 (a row with one present element keeps scale 1). With it the formula's
    1/tau becomes per query, 1/tau(x) = inv_tau / std(phi(x)) — the ``spread`` temperature: scale-free, so one
    constant carries across tables and encoders (research/tau-study.md, "How τ is chosen"). ``+inf`` stays ``+inf``."""
    phi = np.asarray(phi, dtype=np.float64)
    finite = np.isfinite(phi)
    with np.errstate(invalid="ignore"):
        spread = np.nanstd(np.where(finite, phi, np.nan), axis=1)
    spread = np.maximum(np.nan_to_num(spread, nan=1.0), 1e-3)
    return phi / spread[:, None]


def proximity_weights(phi, inv_tau, prior=None) -> np.ndarray:
    """Proximity-tilted weights over a reference set.

    Parameters
    ----------
    phi : array (q, n)
        Proximity penalty of each of n reference elements for each of q queries (a distance).
        ``+inf`` marks an absent element.
    inv_tau : float in [0, inf]
        1/tau. ``inf`` gives the hard nearest-element limit, ``0`` gives the prior.
    prior : None, array (n,) or (q, n)
        Non-negative prior weights p_i (need not be normalized). None means uniform.

    Returns
    -------
    weights : array (q, n), float64, non-negative, each row summing to 1.
    """
    inv_tau = float(inv_tau)
    phi = _check_phi(phi)
    if not inv_tau >= 0:
        raise ValueError(f"inv_tau={inv_tau!r}: must be >= 0")
    if prior is None and np.isfinite(inv_tau) and np.isfinite(phi).all():
        # The common case (uniform prior, every element present): the same formula, fewer passes.
        logits = -inv_tau * phi
        w = np.exp(logits - logits.max(axis=1, keepdims=True))
        return w / w.sum(axis=1, keepdims=True)
    return _tilt(phi, *_prepare(phi, prior), inv_tau)


def _check_phi(phi) -> np.ndarray:
    phi = np.asarray(phi, dtype=np.float64)
    if phi.ndim != 2:
        raise ValueError(f"phi must have shape (q, n), got shape {phi.shape}")
    if np.isnan(phi).any():
        r, c = np.argwhere(np.isnan(phi))[0]
        raise ValueError(f"phi[{r}, {c}] is NaN: distances must be numbers (+inf marks an absent element)")
    return phi


def _prepare(phi, prior):
    """(log p (q, n), present (q, n), phi with absent elements at 0) for the general formula, the prior checked."""
    if prior is None:
        log_prior = np.zeros_like(phi)
    else:
        prior = np.asarray(prior, dtype=np.float64)
        if prior.ndim == 1:
            prior = prior[None, :]
        if prior.shape[-1] != phi.shape[1] or prior.shape[0] not in (1, phi.shape[0]):
            raise ValueError(f"prior shape {prior.shape} does not match phi shape {phi.shape}")
        if np.isnan(prior).any() or (prior < 0).any():
            raise ValueError("prior must be non-negative numbers (0 excludes an element)")
        with np.errstate(divide="ignore"):
            log_prior = np.broadcast_to(np.log(prior), phi.shape)

    present = np.isfinite(phi) & np.isfinite(log_prior)
    empty = ~present.any(axis=1)
    if empty.any():
        raise ValueError(f"query row {int(np.argmax(empty))} has no reference element with finite distance "
                         "and positive prior to weigh")
    # 0 * phi stays 0 for finite phi; absent elements are masked explicitly, never via 0 * inf.
    return log_prior, present, np.where(present, phi, 0.0)


def _tilt(phi, log_prior, present, phi0, inv_tau):
    """The general formula on ``_prepare``'s arrays at one 1/tau, or at an array of finite ones broadcast ahead of
    the (q, n) axes (``bias_variance_weights``: a whole grid at once, the same arithmetic element for element)."""
    if np.ndim(inv_tau) == 0 and np.isinf(inv_tau):
        # tau -> 0: only the nearest present elements survive; among ties the prior decides.
        masked = np.where(present, phi, np.inf)
        nearest = masked == masked.min(axis=1, keepdims=True)
        logits = np.where(nearest, log_prior, -np.inf)
    else:
        logits = np.where(present, log_prior - inv_tau * phi0, -np.inf)

    logits = logits - logits.max(axis=-1, keepdims=True)  # log-sum-exp shift: the max becomes exp(0) = 1
    w = np.exp(logits)
    w /= w.sum(axis=-1, keepdims=True)
    return w


def effective_sample_size(weights) -> np.ndarray:
    """Kish effective sample size 1 / Σ_i w_i² of each row of normalized weights (q, n) -> (q,).

    Equals n for uniform weights over n elements and 1 for a hard assignment (paper appendix F).
    """
    w = np.asarray(weights, dtype=np.float64)
    return 1.0 / np.square(w).sum(axis=1)


BV_GRID = np.concatenate([[0.0], 10 ** np.linspace(0.0, 3.5, 36), [np.inf]])  # bias_variance_inv_tau's 1/tau
BV_CHUNK = 2**18  # bias_variance_weights: grid × queries × elements per block (2 MiB of float64 per array)


def bias_variance_stats(values, sizes, centers_distance, neighbours: int | None = None) -> tuple[np.ndarray, float]:
    """What the plug-in temperature ``bias_variance_inv_tau`` reads from a fitted KMeans router (paper appendix E's
    squared-error bound, variance + bias²): per cluster the variance of its estimate V_i (K,), the mean over models
    of V_im (1 − V_im) / n_i (binomial: exact for 0/1 correctness, an upper bound for graded scores); and L², the
    squared Lipschitz constant of the models' accuracy in the routing distance, by least squares through the origin
    over cluster pairs: mean_m (V_im − V_jm)² − var_i − var_j ≈ L² d_ij², d_ij the distance between centroids
    (``centers_distance``, (K, K)). L² is 0 where no pair says otherwise (fewer than 2 clusters, or differences
    all within the noise). ``neighbours`` m fits L² only over the pairs where j is among i's m nearest clusters or
    i among j's (a *local* constant, where the weights fall; an ablation, research/tau-study.md: local Lipschitz constant — the
    routers use all pairs, None)."""
    V = np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0)
    var = (V * (1.0 - V)).mean(axis=1) / np.maximum(np.asarray(sizes, dtype=np.float64), 1.0)
    D = np.asarray(centers_distance, dtype=np.float64)
    pairs = np.triu(np.ones((len(V), len(V)), dtype=bool), 1)
    if neighbours is not None:
        if not (isinstance(neighbours, (int, np.integer)) and neighbours >= 1):
            raise ValueError(f"neighbours={neighbours!r}: a whole number of clusters >= 1, or None (all pairs)")
        near = np.zeros_like(pairs)
        order = np.argsort(D + np.diag(np.full(len(V), np.inf)), axis=1, kind="stable")[:, :neighbours]
        np.put_along_axis(near, order, True, axis=1)
        pairs &= near | near.T
    iu = np.nonzero(pairs)
    if not len(iu[0]):
        return var, 0.0
    d2 = np.square(D[iu])
    y = np.square(V[:, None, :] - V[None, :, :]).mean(axis=2)[iu] - (var[:, None] + var[None, :])[iu]
    denom = float(np.square(d2).sum())
    return var, max(float((y * d2).sum()) / denom, 0.0) if denom > 0 else 0.0


def bias_variance_inv_tau(phi, prior, var, l2: float, bias_weight: float) -> np.ndarray:
    """Per query the 1/tau (q,) of ``BV_GRID`` whose weights minimize the paper's squared-error bound as a plug-in:
    Σ_i w_i² var_i + c · L² · (Σ_i w_i φ_i)², variance and the bias of averaging values that sit φ_i away
    (``bias_variance_stats``); ``bias_weight`` c scales the bias term, whose triangle-inequality bound overstates the
    bias (KMeans' auto uses c = ``temperature.PLUG_IN_C``). Many small clusters or a
    flat accuracy landscape smooth (toward the prior), large clusters and steep accuracy changes sharpen (toward
    the nearest cluster); ties go to the smoother 1/tau."""
    return _bias_variance(phi, prior, var, l2, bias_weight)[0]


def _bias_variance(phi, prior, var, l2: float, bias_weight: float):
    """(per-query 1/tau (q,), the weights at it (q, n)) for ``bias_variance_inv_tau``."""
    return bias_variance_weights(phi, prior, var, l2, [bias_weight])[0]


def bias_variance_weights(phi, prior, var, l2: float, bias_weights) -> list:
    """``bias_variance_inv_tau`` for several bias weights from one pass over ``BV_GRID``: per weight c, (per-query
    1/tau (q,), the weights at it (q, n)). ``var`` is one variance per reference element (n,), or per query and
    element (q, n) where the elements differ by query (a kNN router's neighbours)."""
    phi = _check_phi(phi)
    var = np.asarray(var, dtype=np.float64)
    if var.shape not in ((phi.shape[1],), phi.shape):
        raise ValueError(f"var of shape {var.shape}: one variance per reference element of phi {phi.shape}")
    cs = [float(c) for c in bias_weights]
    if not (all(0 <= c < np.inf for c in cs) and 0 <= l2 < np.inf):
        raise ValueError(f"bias weights {cs!r}, l2={l2!r}: must be finite numbers >= 0")
    log_prior, present, phi0 = _prepare(phi, prior)  # phi0: phi with absent elements (weight 0) at 0, the bias's φ
    grid = BV_GRID[:-1, None, None]  # the finite 1/tau; inf (last) takes the nearest-element branch of _tilt
    q, n = phi.shape
    out = [(np.empty(q), np.empty((q, n))) for _ in cs]
    step = max(1, BV_CHUNK // (len(BV_GRID) * n))
    for a in range(0, q, step):
        # The whole grid at once for a block of queries: proximity_weights' arithmetic element for element
        # (bitwise the same weights), without its per-call passes (one query: 0.15 ms, not 0.5).
        rows = slice(a, a + step)
        at = (phi[rows], log_prior[rows], present[rows], phi0[rows])
        w = np.concatenate([_tilt(*at, grid), _tilt(*at, np.inf)[None]])  # (len(BV_GRID), block, n)
        var_term = (np.square(w) * (var if var.ndim == 1 else var[rows])).sum(axis=2)
        bias = np.square((w * phi0[rows]).sum(axis=2))
        block = np.arange(w.shape[1])
        for c, (inv_tau, weights) in zip(cs, out):
            s = var_term + c * l2 * bias
            pick, low = np.zeros(len(block), dtype=np.intp), np.full(len(block), np.inf)
            for g in range(len(BV_GRID)):  # ties go to the smoother (earlier) 1/tau
                better = s[g] < low - 1e-15
                pick, low = np.where(better, g, pick), np.where(better, s[g], low)
            inv_tau[rows], weights[rows] = BV_GRID[pick], w[pick, block]
    return out
