"""ProxRouter: one nonparametric estimator over two reference sets (paper §2.2, §3).

    U_hat_m(x) = Σ_i w_i(x) V_i,m        w = proximity_weights(phi(x), inv_tau, prior)

* ``KNNRouter``: the reference set is the k nearest training queries (r_i = x_i, V_i = their
  observed accuracy / cost, uniform prior).
* ``KMeansRouter``: the reference set is K clusters (r_i = centroid, V_i = cluster means,
  prior p_i ∝ n_i / s_i with s_i the mean member distance to the centroid).

``weighting="base"`` is the classic router (KMeans: nearest cluster only, kNN: uniform over the k);
``weighting="prox"`` tilts the prior by exp(-phi / tau). Accuracy and cost are estimated separately,
so λ is chosen per call (``route(X, lam)``) without refitting.

Both follow the scikit-learn contract: ``__init__`` stores hyperparameters, ``fit`` returns self,
learned state ends in ``_``.
"""
from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator

from .index import NeighborIndex, as_matrix, check_metric, pairwise_distance, prepare
from .weights import (TEMPERATURES, bias_variance_stats, check_bv_weight, check_ess_target, resolve_inv_tau,
                      tilted_weights)

WEIGHTINGS = ("base", "prox")


def choose(acc_hat, cost_hat, lam=0.0, allowed=None) -> np.ndarray:
    """argmax_m acc_hat - lam * cost_hat per row; ties go to the cheaper model, then the lower index.

    acc_hat, cost_hat: (q, M). lam: float or (q,). allowed: None, (M,) or (q, M) boolean mask of
    models that may be chosen. Returns (q,) int64 model indices.
    """
    acc_hat = np.asarray(acc_hat, dtype=np.float64)
    cost_hat = np.asarray(cost_hat, dtype=np.float64)
    lam = np.asarray(lam, dtype=np.float64)
    if lam.ndim == 1:
        if len(lam) != len(acc_hat):
            raise ValueError(f"lam has {len(lam)} values for {len(acc_hat)} queries")
        lam = lam[:, None]
    elif lam.ndim != 0:
        raise ValueError(f"lam must be a float or shape (q,), got shape {lam.shape}")
    if (lam < 0).any() or np.isnan(lam).any():
        raise ValueError("lam must be >= 0")
    u = acc_hat - lam * cost_hat
    if allowed is not None:
        allowed = np.broadcast_to(np.asarray(allowed, dtype=bool), u.shape)
        if not allowed.any(axis=1).all():
            raise ValueError("allowed excludes every model for some query")
        u = np.where(allowed, u, -np.inf)
    best = u.max(axis=1, keepdims=True)
    tied = u >= best - 1e-12 * np.maximum(1.0, np.abs(best))
    return np.argmin(np.where(tied, cost_hat, np.inf), axis=1).astype(np.int64)


def lambda_for_target(acc_hat, cost_hat, models, target_cost: float | None = None,
                      target_share: dict | None = None, allowed=None) -> float:
    """The smallest λ >= 0 at which ``choose`` over estimates (q, M) meets a budget on these queries:
    ``target_cost`` — mean estimated cost per query at most this (USD); ``target_share`` — ``{model: s}``,
    each named model chosen for at most a fraction s of the queries (RouteLLM's strong-model percentage,
    for N models and any prices). Both may be given. Mean cost falls monotonically as λ grows, so it is
    bisected; a share need not be monotone for a mid-priced model, so a log grid finds the first λ that
    meets every share and bisection refines it. A target no λ can meet raises ValueError naming it."""
    acc_hat = np.asarray(acc_hat, dtype=np.float64)
    cost_hat = np.asarray(cost_hat, dtype=np.float64)
    models = list(models)
    if target_cost is None and not target_share:
        raise ValueError("give target_cost, target_share, or both")
    if target_cost is not None and not (np.isfinite(target_cost) and target_cost >= 0):
        raise ValueError(f"target_cost={target_cost!r}: must be a finite number >= 0")
    share = {}
    for m, v in (target_share or {}).items():
        if m not in models:
            raise ValueError(f"target_share names {m!r}, not one of the router's models ({', '.join(models)})")
        if not 0 <= v <= 1:
            raise ValueError(f"target_share[{m!r}]={v!r}: must be in [0, 1]")
        share[models.index(m)] = float(v)
    rows = np.arange(len(acc_hat))

    def meets(lam) -> bool:
        pick = choose(acc_hat, cost_hat, lam, allowed)
        ok_cost = target_cost is None or cost_hat[rows, pick].mean() <= target_cost * (1 + 1e-9)
        return ok_cost and all(np.mean(pick == j) <= v + 1e-12 for j, v in share.items())

    if meets(0.0):
        return 0.0
    spread = np.ptp(cost_hat, axis=1)
    gap = spread[spread > 0].min() if (spread > 0).any() else 1.0
    hi = 2.0 / gap  # past it every query takes a cheapest model: accuracies differ by at most 1
    if not meets(hi):
        cheapest = choose(acc_hat, cost_hat, hi, allowed)
        raise ValueError(f"no λ meets the target (target_cost={target_cost}, target_share={target_share}): even "
                         f"the cheapest routing spends {cost_hat[rows, cheapest].mean():.6g} per query with shares "
                         + ", ".join(f"{models[j]} {np.mean(cheapest == j):.3f}" for j in share))
    grid = np.geomspace(hi * 1e-9, hi, 200)
    first = next(i for i, lam in enumerate(grid) if meets(lam))
    lo, hi = (0.0 if first == 0 else grid[first - 1]), grid[first]
    for _ in range(60):  # lo fails, hi meets
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    return float(hi)


def check_targets(acc, cost, n: int | None = None):
    """Validate (acc, cost) training targets: (n, M) in [0, 1] and (n, M) >= 0 or None."""
    acc = np.asarray(acc, dtype=np.float64)
    if acc.ndim != 2:
        raise ValueError(f"acc must have shape (n, M), got shape {acc.shape}")
    if n is not None and acc.shape[0] != n:
        raise ValueError(f"acc has {acc.shape[0]} rows for {n} embeddings")
    if not (np.isfinite(acc).all() and (acc >= 0).all() and (acc <= 1).all()):
        raise ValueError("acc must be finite values in [0, 1]")
    if cost is None:
        return acc, None
    cost = np.asarray(cost, dtype=np.float64)
    if cost.shape != acc.shape:
        raise ValueError(f"cost shape {cost.shape} differs from acc shape {acc.shape}")
    if not (np.isfinite(cost).all() and (cost >= 0).all()):
        raise ValueError("cost must be finite values >= 0")
    return acc, cost


def cluster_sums(labels, values, K: int) -> np.ndarray:
    """Per-cluster sums (K, M) of ``values`` (n, M) for cluster ``labels`` (n,)."""
    return np.stack([np.bincount(labels, weights=values[:, m], minlength=K) for m in range(values.shape[1])], 1)


class RouterMixin:
    """``route`` and ``utility`` for anything with ``estimate(X) -> (acc_hat, cost_hat)``."""

    def route(self, X, lam=0.0, allowed=None) -> np.ndarray:
        """Chosen model index per query (q,), maximizing acc_hat - lam * cost_hat."""
        acc_hat, cost_hat = self.estimate(X)
        return choose(acc_hat, cost_hat, lam, allowed)

    def calibrate(self, X_cal, target_cost: float | None = None, target_share: dict | None = None,
                  allowed=None) -> float:
        """The λ at which routing ``X_cal`` meets the budget (``lambda_for_target``): at most
        ``target_cost`` estimated USD per query, and/or at most ``target_share[m]`` of the queries to m."""
        acc_hat, cost_hat = self.estimate(X_cal)
        return lambda_for_target(acc_hat, cost_hat, self.models_, target_cost, target_share, allowed)

    def utility(self, X, lam=0.0) -> np.ndarray:
        """Estimated objective U_hat (q, M) = acc_hat - lam * cost_hat."""
        acc_hat, cost_hat = self.estimate(X)
        return acc_hat - np.asarray(lam, dtype=np.float64).reshape(-1, 1) * cost_hat

    def _fit_inputs(self, X, acc, cost, models, encoder_id):
        """Validate fit inputs and record what every router learns about them (models_, has_cost_,
        encoder_id_, dim_). Returns (X (n, d) float32, acc (n, M), cost (n, M); zeros without cost)."""
        X = as_matrix(X)
        acc, cost = check_targets(acc, cost, n=len(X))
        if len(X) == 0:
            raise ValueError("cannot fit on an empty training set")
        models = [f"model_{j}" for j in range(acc.shape[1])] if models is None else [str(m) for m in models]
        if len(models) != acc.shape[1]:
            raise ValueError(f"models names {len(models)} entries for {acc.shape[1]} accuracy columns")
        if len(set(models)) != len(models):
            raise ValueError("models contains duplicate names")
        self.models_, self.has_cost_, self.encoder_id_, self.dim_ = models, cost is not None, encoder_id, X.shape[1]
        return X, acc, np.zeros_like(acc) if cost is None else cost

    # Artifacts: arrays + a versioned, checksummed manifest (see proxray.artifact).
    def save(self, path) -> None:
        from .artifact import save_router

        save_router(self, path)

    @classmethod
    def load(cls, path, encoder_id: str | None = None):
        from .artifact import load_router

        return load_router(path, expected_class=cls, encoder_id=encoder_id)


class _ProxRouter(RouterMixin, BaseEstimator):
    """Shared machinery: hyperparameter checks, targets, estimate = weights @ values."""

    def _init_common(self, X, acc, cost, models, encoder_id):
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting={self.weighting!r}: allowed values are {', '.join(WEIGHTINGS)}")
        if self.temperature not in TEMPERATURES:
            raise ValueError(f"temperature={self.temperature!r}: allowed values are {', '.join(TEMPERATURES)}")
        check_metric(self.metric)
        inv_tau = self._effective_inv_tau()
        if self.temperature == "ess" and self.weighting == "prox":
            check_ess_target(inv_tau)
        if self.temperature == "bv":
            check_bv_weight(inv_tau if self.weighting == "prox" else 0.0,
                            "km" if hasattr(self, "bias_variance_stats") else "knn")
        out = self._fit_inputs(X, acc, cost, models, encoder_id)
        self.inv_tau_ = inv_tau
        return out

    def _tilt(self, phi, prior):
        """The formula's weights at the router's temperature: 1/tau as given (``temperature="fixed"``);
        1/tau(x) = inv_tau / std(phi(x)), the distances in units of the query's own spread (``"spread"``,
        ``weights.spread_scaled``); or, per query, the 1/tau at which the weights' effective sample size is
        inv_tau (``"ess"``, ``weights.ess_inv_tau``: an adaptive bandwidth); or the plug-in 1/tau of the
        bias–variance bound with bias weight inv_tau (``"bv"``, KMeans, ``weights.bias_variance_inv_tau``) —
        ``weights.tilted_weights``. Base routers ignore "ess" and "bv" (their 1/tau is a limit, 0 or inf)."""
        temperature = "fixed" if self.temperature in ("ess", "bv") and self.weighting != "prox" else self.temperature
        stats = self.bias_variance_stats() if temperature == "bv" else None
        return tilted_weights(phi, self.inv_tau_, prior, temperature, stats)

    def _check_fitted(self):
        if not hasattr(self, "models_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(X, acc, cost) first")

    def _search(self, X):
        """(phi (q, n_ref), ref_index (q, n_ref) or None, prior) for raw query embeddings X (q, d)."""
        self._check_fitted()
        return self._phi(prepare(as_matrix(X, dim=self.dim_), self.metric))

    def weights(self, X):
        """Weights over the reference set: (w (q, n_ref), ref_index (q, n_ref) or None)."""
        phi, ref, prior = self._search(X)
        return self._tilt(phi, prior), ref

    def _values_at(self, w, ref):
        """Σ_i w_i V_i for dense weights over all reference elements (clusters): two (q, M) arrays."""
        return w @ self.acc_values_, w @ self.cost_values_

    def estimate(self, X):
        """Estimated accuracy and cost of every model: (acc_hat (q, M), cost_hat (q, M))."""
        return self._values_at(*self.weights(X))

    def outlier_score(self, X) -> np.ndarray:
        """Distance (q,) from each query to its nearest reference element (0 = seen before)."""
        return self._search(X)[0].min(axis=1)

    def training_outlier_scores(self, X, chunk: int = 4096) -> np.ndarray:
        """``outlier_score`` of training queries X (q,), as serving computes it but with each query left
        out of the reference set where it is an element of it (kNN: the distance to the nearest *other*
        training query; KMeans: to the nearest centroid). What an outlier threshold is calibrated on: the
        same distance the served router reports, in chunks (no q × n matrix)."""
        X = as_matrix(X, dim=self.dim_)
        return np.concatenate([self._loo_scores(prepare(X[i:i + chunk], self.metric))
                               for i in range(0, len(X), chunk)]) if len(X) else np.zeros(0)

    def _loo_scores(self, R) -> np.ndarray:
        return self._phi(R)[0].min(axis=1)

    def estimate_with_outlier_score(self, X):
        """``estimate`` and ``outlier_score`` from one search (the serving path needs both):
        (acc_hat (q, M), cost_hat (q, M), outlier (q,))."""
        phi, ref, prior = self._search(X)
        acc_hat, cost_hat = self._values_at(self._tilt(phi, prior), ref)
        return acc_hat, cost_hat, phi.min(axis=1)

    def _check_new_targets(self, acc, cost):
        if acc.shape[1] != len(self.models_):
            raise ValueError(f"acc has {acc.shape[1]} model columns, the router has {len(self.models_)}")
        if self.has_cost_ and cost is None:
            raise ValueError("this router was fitted with costs: new queries need costs too")

    def add_model(self, name: str, acc, cost=None):
        """Add a model column without refitting: acc/cost (n_train,) over the training queries in
        the order they were given to ``fit`` and ``add_queries``."""
        self._check_fitted()
        if str(name) in self.models_:
            raise ValueError(f"model {name!r} is already in the router")
        n = self.n_train_
        acc, cost = check_targets(np.asarray(acc, dtype=np.float64).reshape(-1, 1),
                                  None if cost is None else np.asarray(cost, dtype=np.float64).reshape(-1, 1), n=n)
        if self.has_cost_ and cost is None:
            raise ValueError("this router was fitted with costs: add_model needs the new model's cost too")
        self._append_model_column(acc, np.zeros_like(acc) if cost is None else cost)
        self.models_ = self.models_ + [str(name)]
        return self


class KNNRouter(_ProxRouter):
    """k-nearest-neighbour router: reference set = the k nearest training queries.

    Parameters
    ----------
    k : int, neighbours (clipped to the training-set size).
    weighting : "base" (uniform over the k) | "prox" (uniform prior tilted by exp(-phi/tau)).
    inv_tau, tau : temperature of the tilt, as 1/tau (default 20, the paper's) or tau.
    temperature : "fixed" (1/tau as given) | "spread" (1/tau(x) = inv_tau / std of the query's k distances) |
        "ess" (per query the 1/tau at which the weights' effective sample size is inv_tau neighbours).
    metric : "cosine" | "euclidean".
    index : "flat" (exact) | "ivf" | "hnsw" (approximate, for large reference sets).
    nprobe, hnsw_m, ef_search : approximate-index knobs.

    Learned: ``acc_values_``, ``cost_values_`` (n_train, M), ``models_``, ``k_``, ``inv_tau_``,
    ``index_`` (faiss), ``reference_`` (n_train, d) prepared embeddings.
    """

    def __init__(self, k=100, weighting="prox", inv_tau=20.0, tau=None, metric="cosine", index="flat",
                 nprobe=16, hnsw_m=32, ef_search=128, temperature="fixed"):
        self.k = k
        self.weighting = weighting
        self.inv_tau = inv_tau
        self.tau = tau
        self.temperature = temperature
        self.metric = metric
        self.index = index
        self.nprobe = nprobe
        self.hnsw_m = hnsw_m
        self.ef_search = ef_search

    def _effective_inv_tau(self):
        # Base kNN = tau -> inf: the uniform prior over the k neighbours.
        return 0.0 if self.weighting == "base" else resolve_inv_tau(self.inv_tau, self.tau)

    def fit(self, X, acc, cost=None, models=None, encoder_id=None):
        """X (n, d) embeddings, acc (n, M) in [0, 1], cost (n, M) >= 0 or None, models M names."""
        if int(self.k) < 1:
            raise ValueError(f"k={self.k!r}: must be >= 1")
        X, acc, cost = self._init_common(X, acc, cost, models, encoder_id)
        self.acc_values_, self.cost_values_ = acc, cost
        self._values = None
        self.reference_ = prepare(X, self.metric)
        self._build_index()
        return self

    def _build_index(self):
        self.index_ = NeighborIndex(self.dim_, self.metric, self.index, self.nprobe, self.hnsw_m, self.ef_search)
        self.index_.add(self.reference_)

    @property
    def n_train_(self):
        return len(self.acc_values_)

    @property
    def k_(self):
        return min(int(self.k), self.n_train_)

    def _phi(self, Xq):
        dist, idx = self.index_.search(Xq, self.k_)
        return dist, idx, None  # uniform prior over the k neighbours

    def _loo_scores(self, R) -> np.ndarray:
        dist, _ = self.index_.search(R, min(2, self.n_train_))
        if dist.shape[1] < 2:
            return dist[:, 0]
        return np.where(dist[:, 0] <= 1e-6, dist[:, 1], dist[:, 0])  # itself at distance 0: the next one

    def _values_at(self, w, ref):
        """Σ_i w_i V_i over each query's k neighbours ``ref`` (q, k): two (q, M) arrays."""
        # Gathering the k neighbours' rows is the main cost beyond the search: one gather from a
        # stacked (n, 2M) copy serves accuracy and cost together. Absent neighbours (-1) weigh 0.
        if getattr(self, "_values", None) is None:
            self._values = np.hstack([self.acc_values_, self.cost_values_])
        out = np.matmul(w[:, None, :], self._values[np.maximum(ref, 0)])[:, 0, :]
        M = self.acc_values_.shape[1]
        return out[:, :M], out[:, M:]

    def add_queries(self, X, acc, cost=None):
        """Add labeled training queries without refitting (an index add)."""
        self._check_fitted()
        X = as_matrix(X, dim=self.dim_)
        acc, cost = check_targets(acc, cost, n=len(X))
        self._check_new_targets(acc, cost)
        R = prepare(X, self.metric)
        self.acc_values_ = np.vstack([self.acc_values_, acc])
        self.cost_values_ = np.vstack([self.cost_values_, np.zeros_like(acc) if cost is None else cost])
        self.reference_ = np.vstack([self.reference_, R])
        self._values = None
        self.index_.add(R)
        return self

    def _append_model_column(self, acc, cost):
        self.acc_values_ = np.hstack([self.acc_values_, acc])
        self.cost_values_ = np.hstack([self.cost_values_, cost])
        self._values = None

    # State for artifacts: plain arrays only.
    def _state(self):
        return {"reference": self.reference_, "acc_values": self.acc_values_, "cost_values": self.cost_values_}

    def _set_state(self, arrays, meta):
        self.reference_ = arrays["reference"]
        self.acc_values_, self.cost_values_ = arrays["acc_values"], arrays["cost_values"]
        self._values = None
        self.dim_ = self.reference_.shape[1]
        self._build_index()


SPREAD_RESOLUTION = 1e-2  # KMeansRouter.prior_: a spread this far below the median is rounding, not spread


class KMeansRouter(_ProxRouter):
    """KMeans router: reference set = K clusters of the training queries.

    Parameters
    ----------
    n_clusters : K.
    weighting : "base" (nearest cluster only) | "prox" (prior tilted by exp(-phi/tau) over all K).
    inv_tau, tau : temperature of the tilt (default 1/tau = 20, the paper's).
    temperature : "fixed" (1/tau as given) | "spread" (1/tau(x) = inv_tau / std of the query's K distances) |
        "ess" (per query the 1/tau at which the weights' effective sample size is inv_tau clusters; KMeans'
        ``--inv-tau auto`` may choose it, README: How τ is chosen) | "bv" (per query the plug-in 1/tau that
        minimizes the paper's bias–variance bound, inv_tau weighting its bias term; ``bias_variance_stats``).
    metric : "cosine" | "euclidean" (distance of queries to centroids, and of members for s_i).
    prior : "spread" (p_i ∝ n_i / s_i, the paper's least-variance prior) | "size" (∝ n_i) | "uniform".
    random_state, n_init : KMeans seeding.

    Learned: ``centers_`` (K, d) prepared centroids, ``sizes_`` n_i (K,), ``spreads_`` s_i (K,),
    ``acc_values_``, ``cost_values_`` (K, M) cluster means, ``labels_`` (n_train,) cluster of each
    training query, ``prior_`` (K,), ``models_``, ``inv_tau_``.
    """

    PRIORS = ("spread", "size", "uniform")

    def __init__(self, n_clusters=32, weighting="prox", inv_tau=20.0, tau=None, metric="cosine", prior="spread",
                 random_state=42, n_init=3, temperature="fixed"):
        self.n_clusters = n_clusters
        self.weighting = weighting
        self.inv_tau = inv_tau
        self.tau = tau
        self.temperature = temperature
        self.metric = metric
        self.prior = prior
        self.random_state = random_state
        self.n_init = n_init

    def _effective_inv_tau(self):
        # Base KMeans = tau -> 0: nearest cluster only.
        return np.inf if self.weighting == "base" else resolve_inv_tau(self.inv_tau, self.tau)

    def fit(self, X, acc, cost=None, models=None, encoder_id=None):
        """X (n, d) embeddings, acc (n, M) in [0, 1], cost (n, M) >= 0 or None, models M names."""
        from sklearn.cluster import KMeans

        if self.prior not in self.PRIORS:
            raise ValueError(f"prior={self.prior!r}: allowed values are {', '.join(self.PRIORS)}")
        X, acc, cost = self._init_common(X, acc, cost, models, encoder_id)
        K = int(self.n_clusters)
        if not 1 <= K <= len(X):
            raise ValueError(f"n_clusters={self.n_clusters!r}: must be between 1 and the {len(X)} training queries")
        R = prepare(X, self.metric)
        km = KMeans(n_clusters=K, random_state=self.random_state, n_init=self.n_init).fit(R)
        self.centers_ = prepare(km.cluster_centers_.astype(np.float32), self.metric)
        # membership by the distance routing and add_queries use (to the prepared centroids), not by
        # sklearn's euclidean labels against the raw centroids: n_i, s_i and V_i describe what routing sees
        self._assign_fit(R, self._nearest(R), acc, cost)
        return self

    def _nearest(self, R) -> np.ndarray:
        """The cluster of each prepared row: nearest prepared centroid in the router's metric."""
        return np.argmin(pairwise_distance(R, self.centers_, self.metric), axis=1).astype(np.int64)

    def _assign_fit(self, R, labels, acc, cost):
        """Cluster statistics from an assignment: n_i, s_i, V_i (cluster means)."""
        K = len(self.centers_)
        self.labels_ = labels
        self.sizes_ = np.bincount(labels, minlength=K).astype(np.float64)
        dist = self._member_distance(R, labels)
        self.spreads_ = np.bincount(labels, weights=dist, minlength=K) / np.maximum(self.sizes_, 1)
        n = np.maximum(self.sizes_, 1)[:, None]
        self.acc_values_ = cluster_sums(labels, acc, K) / n
        self.cost_values_ = cluster_sums(labels, cost, K) / n

    def _member_distance(self, R, labels):
        return pairwise_distance(R, self.centers_, self.metric)[np.arange(len(R)), labels]

    @property
    def n_train_(self):
        return len(self.labels_)

    @property
    def prior_(self):
        """p_i over the K clusters, normalized; empty clusters get 0.

        s_i is 0 for a one-member cluster (or identical members) — or, computed in float32, a rounding
        remainder of the member's distance to itself (~1e-7; which one depends on the BLAS threads): every
        spread is floored at the smallest real one, a spread below ``SPREAD_RESOLUTION`` × the median
        positive spread counting as none, so the prior stays finite and still favours compact clusters
        (a remainder taken as a spread once gave one training query 99.6 % of the prior). Kept until n_i or
        s_i change (``_kept``): every routed query reads it.
        """
        return self._kept("_prior_memo", (self.prior, self.sizes_, self.spreads_), self._compute_prior)

    def _compute_prior(self):
        n = self.sizes_
        if self.prior == "uniform":
            p = (n > 0).astype(np.float64)
        elif self.prior == "size":
            p = n.copy()
        else:
            s = self.spreads_
            live = (n > 0) & (s > 0)
            resolution = SPREAD_RESOLUTION * float(np.median(s[live])) if live.any() else 0.0
            positive = s[live & (s > resolution)]
            floor = positive.min() if len(positive) else 1.0
            p = np.where(n > 0, n / np.maximum(s, floor), 0.0)
        p = p / p.sum()
        p.setflags(write=False)  # shared by every call until the clusters change
        return p

    def _kept(self, name: str, key: tuple, compute):
        """``compute()``, kept under attribute ``name`` until an entry of ``key`` changes: arrays by identity (fit,
        load and ``add_queries`` assign new ones rather than writing into them), anything else by equality."""
        memo = getattr(self, name, None)
        if memo is None or any(a is not b and (isinstance(a, np.ndarray) or a != b) for a, b in zip(memo[0], key)):
            memo = (key, compute())
            setattr(self, name, memo)
        return memo[1]

    def _phi(self, Xq):
        return pairwise_distance(Xq, self.centers_, self.metric), None, self.prior_

    def bias_variance_stats(self):
        """(var (K,), L²) of ``weights.bias_variance_stats`` for the fitted clusters — what ``temperature="bv"``
        reads; derived from n_i, V_i and the centroids, so it follows ``add_queries`` and needs nothing saved.
        Kept until those arrays change (``_kept``): routing pays the K × K pass once, not per batch."""
        self._check_fitted()
        return self._kept("_bv_memo", (self.acc_values_, self.sizes_, self.centers_), lambda: bias_variance_stats(
            self.acc_values_, self.sizes_, pairwise_distance(self.centers_, self.centers_, self.metric)))

    def add_queries(self, X, acc, cost=None):
        """Add labeled queries without refitting: each joins its nearest cluster and updates n_i, s_i
        and V_i as running means. Centroids stay fixed, so s_i stays a mean distance to r_i."""
        self._check_fitted()
        X = as_matrix(X, dim=self.dim_)
        acc, cost = check_targets(acc, cost, n=len(X))
        self._check_new_targets(acc, cost)
        cost = np.zeros_like(acc) if cost is None else cost
        R = prepare(X, self.metric)
        labels = self._nearest(R)
        K = len(self.centers_)
        add_n = np.bincount(labels, minlength=K).astype(np.float64)
        new_n = self.sizes_ + add_n
        denom = np.maximum(new_n, 1)
        add_s = np.bincount(labels, weights=self._member_distance(R, labels), minlength=K)
        self.spreads_ = (self.spreads_ * self.sizes_ + add_s) / denom

        old_n = self.sizes_[:, None]
        self.acc_values_ = (self.acc_values_ * old_n + cluster_sums(labels, acc, K)) / denom[:, None]
        self.cost_values_ = (self.cost_values_ * old_n + cluster_sums(labels, cost, K)) / denom[:, None]
        self.sizes_ = new_n
        self.labels_ = np.concatenate([self.labels_, labels])
        return self

    def _append_model_column(self, acc, cost):
        K, n = len(self.centers_), np.maximum(self.sizes_, 1)[:, None]
        self.acc_values_ = np.hstack([self.acc_values_, cluster_sums(self.labels_, acc, K) / n])
        self.cost_values_ = np.hstack([self.cost_values_, cluster_sums(self.labels_, cost, K) / n])

    def _state(self):
        return {"centers": self.centers_, "sizes": self.sizes_, "spreads": self.spreads_, "labels": self.labels_,
                "acc_values": self.acc_values_, "cost_values": self.cost_values_}

    def _set_state(self, arrays, meta):
        self.centers_, self.sizes_, self.spreads_ = arrays["centers"], arrays["sizes"], arrays["spreads"]
        self.labels_ = arrays["labels"]
        self.acc_values_, self.cost_values_ = arrays["acc_values"], arrays["cost_values"]
        self.dim_ = self.centers_.shape[1]
