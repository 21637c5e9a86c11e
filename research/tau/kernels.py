"""Kernels of the τ study that proxray does not ship: the adaptive bandwidth ("ess"), the bias weight check of the
plug-in's earlier spelling, and ``tilted_weights``, the study's one switch over every temperature it measured
("fixed", "spread", "ess", "bv"). The shipped temperatures are ``proxray.routing.temperature``."""
from __future__ import annotations

import numpy as np

from proxray.routing.weights import (_bias_variance, effective_sample_size, proximity_weights,  # noqa: F401
                                     spread_scaled)

TEMPERATURES = ("fixed", "spread", "ess", "bv")  # how the study reads a number inv_tau


def resolve_inv_tau(inv_tau=20.0, tau=None) -> float:
    """Return 1/tau as a float in [0, inf], from either spelling of the temperature.

    ``tau=0`` means inv_tau = inf (hard nearest), ``tau=inf`` means inv_tau = 0 (the prior).
    """
    if tau is not None:
        tau = float(tau)
        if not tau >= 0:
            raise ValueError(f"tau={tau!r}: must be >= 0 (0 = hard nearest, inf = plain prior average)")
        return np.inf if tau == 0 else 1.0 / tau
    if isinstance(inv_tau, str):
        raise ValueError(f"inv_tau={inv_tau!r}: a number >= 0 is required here ('auto' is resolved by "
                         "research/tau/cv.py before fitting)")
    inv_tau = float(inv_tau)
    if not inv_tau >= 0:
        raise ValueError(f"inv_tau={inv_tau!r}: must be a number >= 0 (0 = plain prior average, inf = hard nearest)")
    return inv_tau


ESS_LOG_RANGE = (-8.0, 12.0)  # ess_inv_tau searches log(1/tau) here: ~the prior (e^-8) .. ~hard nearest (e^12)


def check_ess_target(target) -> float:
    """``target`` as a float if it can be an effective sample size for ``temperature="ess"`` (finite, >= 1), else a
    ValueError naming it: the routers and the command lines check it before any work."""
    target = float(target)
    if not 1 <= target < np.inf:
        raise ValueError(f"inv_tau={target!r} with temperature='ess': the number is the effective sample size every "
                         "query's weights are given, a finite number >= 1 (1 = the nearest element only)")
    return target


def ess_inv_tau(phi, prior, target: float, iters: int = 40) -> np.ndarray:
    """Per query, the 1/tau (q,) at which ``proximity_weights(phi, 1/tau, prior)`` has Kish effective sample size
    ``target`` (``effective_sample_size``): an adaptive bandwidth, as t-SNE calibrates its perplexity per point —
    every query mixes about ``target`` reference elements, however far it is from all of them. The ESS falls as
    1/tau grows, so log(1/tau) is bisected within ``ESS_LOG_RANGE``; a query whose prior alone has a smaller ESS
    gets the range's low end (nearly the prior), one whose nearest elements tie above the target its high end."""
    phi = np.asarray(phi, dtype=np.float64)
    target = float(target)
    if not target >= 1:
        raise ValueError(f"target={target!r}: an effective sample size must be >= 1")
    lo, hi = np.full(len(phi), ESS_LOG_RANGE[0]), np.full(len(phi), ESS_LOG_RANGE[1])
    shifted = phi - np.where(np.isfinite(phi), phi, np.inf).min(axis=1, keepdims=True)  # same weights, smaller logits
    for _ in range(iters):
        mid = (lo + hi) / 2
        ess = effective_sample_size(proximity_weights(shifted * np.exp(mid)[:, None], 1.0, prior))
        lo, hi = np.where(ess > target, mid, lo), np.where(ess > target, hi, mid)
    return np.exp((lo + hi) / 2)


def check_bv_weight(weight, router: str = "km") -> float:
    """``weight`` as a float if it can be the bias weight c of ``temperature="bv"`` (finite, >= 0) for ``router``
    (KMeans only: the plug-in reads cluster statistics), else a ValueError naming it: the routers and the command
    lines check it before any work."""
    if router != "km":
        raise ValueError(f"temperature='bv': the plug-in temperature reads cluster statistics (n_i, V_i, centroids); "
                         f"router={router!r} has none (KMeans routers only)")
    weight = float(weight)
    if not 0 <= weight < np.inf:
        raise ValueError(f"inv_tau={weight!r} with temperature='bv': the number is the bias term's weight c, a finite "
                         "number >= 0")
    return weight


def tilted_weights(phi, inv_tau, prior=None, temperature: str = "fixed", bv_stats=None) -> np.ndarray:
    """``proximity_weights`` at one of the ``TEMPERATURES``: "fixed", 1/tau = ``inv_tau`` as given; "spread",
    1/tau(x) = inv_tau / std(phi(x)) (``spread_scaled``); "ess", per query the 1/tau at which the weights' Kish
    effective sample size is ``inv_tau`` (``ess_inv_tau``); "bv", per query the plug-in 1/tau of the bias–variance
    bound with bias weight ``inv_tau`` (``bias_variance_inv_tau``; ``bv_stats`` = (var, l2) from
    ``bias_variance_stats``, KMeans only). The routers and auto's CV (``tuning.estimates_over``) tilt through it, so
    each temperature is written once."""
    if temperature == "spread":
        return proximity_weights(spread_scaled(phi), inv_tau, prior)
    if temperature == "ess":
        return proximity_weights(np.asarray(phi) * ess_inv_tau(phi, prior, inv_tau)[:, None], 1.0, prior)
    if temperature == "bv":
        if bv_stats is None:
            raise ValueError("temperature='bv' needs bv_stats=(var, l2) from bias_variance_stats (KMeans routers)")
        return _bias_variance(phi, prior, *bv_stats, inv_tau)[1]
    if temperature != "fixed":
        raise ValueError(f"temperature={temperature!r}: allowed values are {', '.join(TEMPERATURES)}")
    return proximity_weights(phi, inv_tau, prior)
