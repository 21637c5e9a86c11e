"""ProxRouter: one nonparametric estimator over two reference sets (paper §2.2, §3).

    U_hat_m(x) = Σ_i w_i(x) V_i,m        w_i(x) ∝ p_i · exp(−φ_i(x) / τ)      (``weights``, ``temperature``)

* ``KNNRouter``: the reference set is the k nearest training queries (r_i = x_i, V_i = their
  observed accuracy / cost, uniform prior).
* ``KMeansRouter``: the reference set is K clusters (r_i = centroid, V_i = cluster means,
  prior p_i ∝ n_i / s_i with s_i the mean member distance to the centroid).

``weighting="base"`` is the classic router (KMeans: nearest cluster only, kNN: uniform over the k);
``weighting="prox"`` tilts the prior by exp(-phi / tau) at the router's ``temperature`` (default ``"auto"``, the
temperature that ships for the router: the same router ``proxray fit`` builds; a number is a fixed 1/tau;
``proxray.routing.temperature``). The temperature is parsed once, when it is set, into a typed ``Temperature``. Accuracy and cost
are estimated separately, so λ is chosen per call (``route(X, lam)``) without refitting.

Both follow the scikit-learn contract: ``__init__`` stores hyperparameters, ``fit`` returns self, learned state
ends in ``_``, an unfitted router raises ``sklearn.exceptions.NotFittedError``. The two steps of an estimate are
public: ``neighbourhood(X)`` (distances, reference indices, prior) and ``estimate_at(w, nb)`` (Σ_i w_i V_i).
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from proxray.routing import artifact
from proxray.routing.index import NeighborIndex, as_matrix, check_metric, fit_index, pairwise_distance, prepare
from proxray.routing.objective import choose, lambda_for_target, objective
from proxray.routing.provenance import TrainingProvenance
from proxray.routing.temperature import Fixed, Temperature, legacy, parse_temperature
from proxray.routing.weights import bias_variance_stats

WEIGHTINGS = ("base", "prox")


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


class RouterMixin(TrainingProvenance):
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
        return objective(acc_hat, cost_hat, np.broadcast_to(np.asarray(lam, dtype=np.float64), len(acc_hat)))

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

    def _check_fitted(self):
        check_is_fitted(self, "models_", msg=f"This {type(self).__name__} is not fitted: call fit(X, acc, cost) first")

    # Artifacts: arrays + a versioned, checksummed manifest (proxray.routing.artifact).
    def save(self, path):
        """A new version of the artifact at ``path`` (a folder or a URI); returns the version's location."""
        return artifact.save_router(self, path)

    @classmethod
    def load(cls, path, encoder_id: str | None = None):
        """An artifact of this class (``proxray.routing.registry.load_router`` loads any router class)."""
        return artifact.load_router(path, {cls.__name__: cls}, expected_class=cls, encoder_id=encoder_id)


class Neighbourhood(NamedTuple):
    """What the weights are computed over for a batch of queries: ``phi`` (q, n) distances to the reference
    elements (+inf: absent), ``ref`` (q, n) their indices into the training queries (kNN) or None (KMeans: all
    clusters, in order), and ``prior`` (n,) or None (uniform)."""
    phi: np.ndarray
    ref: np.ndarray | None
    prior: np.ndarray | None


class _ProxRouter(RouterMixin, BaseEstimator):
    """Shared machinery: hyperparameter checks, targets, estimate = weights @ values."""

    kind = ""  # "km" / "knn": what "auto" and a temperature's scope refer to

    def _set_hyper(self, weighting, temperature, deprecated: dict):
        """``__init__``'s temperature: as given, or what the deprecated ``inv_tau`` / ``tau`` keywords meant."""
        self.weighting = weighting
        if deprecated:
            unknown = set(deprecated) - {"inv_tau", "tau"}
            if unknown:
                raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments {sorted(unknown)}")
            name = temperature if temperature in ("fixed", "spread", "bv", "plug-in", "ess") else "fixed"
            spec = legacy(deprecated.get("inv_tau"), deprecated.get("tau"), name)
            warnings.warn(f"{type(self).__name__}(inv_tau=..., tau=...) is deprecated: say temperature="
                          f"{spec if isinstance(spec, str) else spec.spec!r} instead", DeprecationWarning, stacklevel=3)
            temperature = spec
        self.temperature = temperature

    @property
    def temperature(self) -> Temperature:
        """Prox's temperature, a typed ``Temperature`` (``"auto"`` resolved to the router's shipped one)."""
        return self._temperature

    @temperature.setter
    def temperature(self, value) -> None:  # the one place a router parses it (construction, set_params)
        self._temperature = parse_temperature(value, self.kind)

    def _effective_temperature(self) -> Temperature:
        """The temperature the weights use: ``temperature`` for Prox; for Base the formula's limit (KMeans
        1/tau = inf, the nearest cluster; kNN 1/tau = 0, uniform over the k)."""
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting={self.weighting!r}: allowed values are {', '.join(WEIGHTINGS)}")
        if self.weighting == "base":
            return Fixed(np.inf if self.kind == "km" else 0.0)
        return self.temperature

    def _init_common(self, X, acc, cost, models, encoder_id):
        temperature = self._effective_temperature()
        check_metric(self.metric)
        out = self._fit_inputs(X, acc, cost, models, encoder_id)
        self.temperature_ = temperature
        return out

    def neighbourhood(self, X) -> Neighbourhood:
        """Distances, reference indices and prior for raw query embeddings X (q, d): the first step of
        ``estimate``, which weighs them (``temperature_.weights``) and averages (``estimate_at``)."""
        self._check_fitted()
        return Neighbourhood(*self._phi(prepare(as_matrix(X, dim=self.dim_), self.metric)))

    def weights(self, X):
        """Weights over the reference set: (w (q, n_ref), ref_index (q, n_ref) or None)."""
        nb = self.neighbourhood(X)
        return self.temperature_.weights(nb.phi, nb.prior, self), nb.ref

    def estimate_at(self, w, nb):
        """Σ_i w_i V_i: (acc_hat (q, M), cost_hat (q, M)) for weights ``w`` (q, n) over the elements of ``nb`` (a
        ``Neighbourhood``, or its ``ref``)."""
        return self._values_at(w, nb.ref if isinstance(nb, Neighbourhood) else nb)

    def _values_at(self, w, ref):
        return w @ self.acc_values_, w @ self.cost_values_

    def estimate(self, X):
        """Estimated accuracy and cost of every model: (acc_hat (q, M), cost_hat (q, M))."""
        return self._values_at(*self.weights(X))

    def outlier_score(self, X) -> np.ndarray:
        """Distance (q,) from each query to its nearest reference element (0 = seen before)."""
        return self.neighbourhood(X).phi.min(axis=1)

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
        nb = self.neighbourhood(X)
        acc_hat, cost_hat = self.estimate_at(self.temperature_.weights(nb.phi, nb.prior, self), nb)
        return acc_hat, cost_hat, nb.phi.min(axis=1)

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


def check_k(k, n: int, name: str = "k=") -> None:
    """``k`` neighbours out of ``n`` training queries: an error that names both before any work (encoding, the
    index) when it is not an integer in [1, n]. ``name``: how the caller spells the setting (``--k ``)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= int(k) <= n:
        raise ValueError(f"{name}{k!r}: the neighbours per query must be an integer from 1 to the training queries' "
                         f"number ({n}); pass {name}{min(max(n, 1), 100)} or add training queries")


class KNNRouter(_ProxRouter):
    """k-nearest-neighbour router: reference set = the k nearest training queries.

    Parameters
    ----------
    k : int, neighbours (clipped to the training-set size).
    weighting : "base" (uniform over the k) | "prox" (uniform prior tilted by exp(-phi/tau)).
    temperature : Prox's temperature (``proxray.routing.temperature``): "auto" (default) kNN's shipped one
        (spread:0.2, 1/tau(x) = 0.2 / std of the query's k distances), a number a fixed 1/tau (the paper's 20), or
        a ``Fixed`` / ``Spread`` value or its string ("spread:0.2").
    metric : "cosine" | "euclidean".
    index : "auto" (default: exact search up to 8k references, an HNSW graph above, tuned to recall_floor) |
        "flat" (exact) | "ivf" | "hnsw" (approximate, for large reference sets; see ``proxray.routing.index``).
    recall_floor : recall@k against exact search an approximate index must reach on a sample of the references
        (auto falls back to exact search below it; ivf / hnsw by name are an error). 0 accepts any.
    nprobe : IVF lists searched; None (default) tunes it: the fewest that reach recall_floor.
    nlist : IVF lists; None: ~2 sqrt(n). hnsw_m : HNSW graph degree.
    ef_search : HNSW search breadth; None (default) tunes it: the least (64, 96, 144, ...) that reaches recall_floor.

    Learned: ``acc_values_``, ``cost_values_`` (n_train, M), ``models_``, ``k_``, ``temperature_``,
    ``index_`` (faiss), ``index_info_`` (its kind, parameters and the recall it reached), ``reference_``
    (n_train, d) prepared embeddings.
    """

    kind = "knn"

    def __init__(self, k=100, weighting="prox", temperature="auto", metric="cosine", index="auto",
                 recall_floor=0.95, nprobe=None, nlist=None, hnsw_m=32, ef_search=None, **deprecated):
        self.k = k
        self._set_hyper(weighting, temperature, deprecated)
        self.metric = metric
        self.index = index
        self.recall_floor = recall_floor
        self.nprobe = nprobe
        self.nlist = nlist
        self.hnsw_m = hnsw_m
        self.ef_search = ef_search

    def fit(self, X, acc, cost=None, models=None, encoder_id=None, query_ids=None, tasks=None):
        """X (n, d) embeddings, acc (n, M) in [0, 1], cost (n, M) >= 0 or None, models M names; query_ids and tasks
        (n,) what the evidence of a decision names its neighbours by (optional)."""
        check_k(self.k, len(X))
        X, acc, cost = self._init_common(X, acc, cost, models, encoder_id)
        self.acc_values_, self.cost_values_ = acc, cost
        self._values = None
        self.reference_ = prepare(X, self.metric)
        self._build_index()
        self._note_training(X, query_ids, tasks)
        return self

    def _build_index(self):
        if not 0.0 <= float(self.recall_floor) <= 1.0:
            raise ValueError(f"recall_floor={self.recall_floor!r}: must be in [0, 1]")
        self.index_, self.index_info_ = fit_index(self.reference_, self.metric, self.index, self.k_,
                                                  float(self.recall_floor), self.nprobe, self.nlist, self.hnsw_m,
                                                  self.ef_search)

    @property
    def n_train_(self):
        return len(self.acc_values_)

    @property
    def k_(self):  # min: an artifact saved before k was checked may hold fewer references than k
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

    def add_queries(self, X, acc, cost=None, query_ids=None, tasks=None):
        """Add labeled training queries without refitting (an index add)."""
        self._check_fitted()
        self._check_growth(len(X), query_ids, tasks)
        X = as_matrix(X, dim=self.dim_)
        acc, cost = check_targets(acc, cost, n=len(X))
        self._check_new_targets(acc, cost)
        R = prepare(X, self.metric)
        self.acc_values_ = np.vstack([self.acc_values_, acc])
        self.cost_values_ = np.vstack([self.cost_values_, np.zeros_like(acc) if cost is None else cost])
        self.reference_ = np.vstack([self.reference_, R])
        self._values = None
        self.index_.add(R)
        self._grow_training(len(R), query_ids, tasks)
        return self

    def _append_model_column(self, acc, cost):
        self.acc_values_ = np.hstack([self.acc_values_, acc])
        self.cost_values_ = np.hstack([self.cost_values_, cost])
        self._values = None

    # State for artifacts: plain arrays only (an approximate index as faiss serializes it: read, not rebuilt).
    def _state(self):
        state = {"reference": self.reference_, "acc_values": self.acc_values_, "cost_values": self.cost_values_}
        if self.index_.kind != "flat":
            state["index"] = self.index_.to_bytes()
        return state

    def _set_state(self, arrays, meta):
        self.reference_ = arrays["reference"]
        self.acc_values_, self.cost_values_ = arrays["acc_values"], arrays["cost_values"]
        self._values = None
        self.dim_ = self.reference_.shape[1]
        info = getattr(meta, "index", None)
        if "index" in arrays and info:
            self.index_ = NeighborIndex.from_bytes(arrays["index"], self.dim_, self.metric, info)
            self.index_info_ = dict(info)
        elif info and info.get("kind") == "flat":  # an exact index is the references themselves
            self.index_ = NeighborIndex(self.dim_, self.metric, "flat")
            self.index_.add(self.reference_)
            self.index_info_ = dict(info)
        else:  # saved before indexes were recorded: built as its parameters say
            self._build_index()


SPREAD_RESOLUTION = 1e-2  # KMeansRouter.prior_: a spread this far below the median is rounding, not spread
KMEANS_ALL_ROWS_MAX = 50_000  # KMeansRouter: scikit-learn's KMeans on every row up to this; faiss's on a sample above
KMEANS_POINTS_PER_CLUSTER = 256  # the sample faiss's KMeans trains on, per cluster


def sampled_kmeans(R: np.ndarray, K: int, seed: int, n_init: int) -> np.ndarray:
    """Centroids (K, d) of faiss's KMeans on a seeded sample of ``KMEANS_POINTS_PER_CLUSTER`` rows per cluster
    (``n_init`` runs, the lowest objective kept)."""
    import faiss

    seed = 0 if seed is None else int(seed) % 2**31
    n_sample = min(len(R), KMEANS_POINTS_PER_CLUSTER * K)
    pick = np.sort(np.random.default_rng(seed).choice(len(R), n_sample, replace=False))
    km = faiss.Kmeans(R.shape[1], K, niter=25, nredo=max(1, int(n_init)), seed=seed,
                      max_points_per_centroid=KMEANS_POINTS_PER_CLUSTER, verbose=False)
    km.train(np.ascontiguousarray(R[pick]))
    return np.asarray(km.centroids)


class KMeansRouter(_ProxRouter):
    """KMeans router: reference set = K clusters of the training queries.

    Parameters
    ----------
    n_clusters : K.
    weighting : "base" (nearest cluster only) | "prox" (prior tilted by exp(-phi/tau) over all K).
    temperature : Prox's temperature (``proxray.routing.temperature``): "auto" (default) KMeans' shipped one
        (plug-in:0.125, per query the 1/tau minimizing the paper's bias–variance bound over the clusters,
        ``bias_variance_stats``), a number a fixed 1/tau (the paper's 20), or a ``Fixed`` / ``Spread`` / ``PlugIn``
        value or its string.
    metric : "cosine" | "euclidean" (distance of queries to centroids, and of members for s_i).
    prior : "spread" (p_i ∝ n_i / s_i, the paper's least-variance prior) | "size" (∝ n_i) | "uniform".
    random_state, n_init : KMeans seeding. Up to 50k training queries scikit-learn's KMeans fits them all; above,
        faiss's KMeans fits a sample of 256 per cluster (n_init runs, the best kept) and every query joins its
        nearest centroid: a million queries fit in seconds instead of minutes.

    Learned: ``centers_`` (K, d) prepared centroids, ``sizes_`` n_i (K,), ``spreads_`` s_i (K,),
    ``acc_values_``, ``cost_values_`` (K, M) cluster means, ``labels_`` (n_train,) cluster of each
    training query, ``prior_`` (K,), ``models_``, ``temperature_``.
    """

    PRIORS = ("spread", "size", "uniform")

    kind = "km"

    def __init__(self, n_clusters=32, weighting="prox", temperature="auto", metric="cosine", prior="spread",
                 random_state=42, n_init=3, **deprecated):
        self.n_clusters = n_clusters
        self._set_hyper(weighting, temperature, deprecated)
        self.metric = metric
        self.prior = prior
        self.random_state = random_state
        self.n_init = n_init

    def fit(self, X, acc, cost=None, models=None, encoder_id=None, query_ids=None, tasks=None):
        """X (n, d) embeddings, acc (n, M) in [0, 1], cost (n, M) >= 0 or None, models M names; query_ids and tasks
        (n,) what the evidence of a decision describes its clusters by (optional)."""
        from sklearn.cluster import KMeans

        if self.prior not in self.PRIORS:
            raise ValueError(f"prior={self.prior!r}: allowed values are {', '.join(self.PRIORS)}")
        X, acc, cost = self._init_common(X, acc, cost, models, encoder_id)
        K = int(self.n_clusters)
        if not 1 <= K <= len(X):
            raise ValueError(f"n_clusters={self.n_clusters!r}: must be between 1 and the {len(X)} training queries")
        R = prepare(X, self.metric)
        if len(R) <= KMEANS_ALL_ROWS_MAX:
            centers = KMeans(n_clusters=K, random_state=self.random_state, n_init=self.n_init).fit(R).cluster_centers_
        else:
            centers = sampled_kmeans(R, K, self.random_state, self.n_init)
        self.centers_ = prepare(centers.astype(np.float32), self.metric)
        # membership by the distance routing and add_queries use (to the prepared centroids), not by
        # sklearn's euclidean labels against the raw centroids: n_i, s_i and V_i describe what routing sees
        self._assign_fit(R, self._nearest(R), acc, cost)
        self._note_training(X, query_ids, tasks)
        return self

    def _nearest(self, R, chunk: int = 65536) -> np.ndarray:
        """The cluster of each prepared row: nearest prepared centroid in the router's metric (in chunks of rows)."""
        return np.concatenate([np.argmin(pairwise_distance(R[i:i + chunk], self.centers_, self.metric), axis=1)
                               for i in range(0, len(R), chunk)] or [np.zeros(0)]).astype(np.int64)

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

    def add_queries(self, X, acc, cost=None, query_ids=None, tasks=None):
        """Add labeled queries without refitting: each joins its nearest cluster and updates n_i, s_i
        and V_i as running means. Centroids stay fixed, so s_i stays a mean distance to r_i."""
        self._check_fitted()
        self._check_growth(len(X), query_ids, tasks)
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
        self._grow_training(len(R), query_ids, tasks)
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
