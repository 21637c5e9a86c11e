"""``KMeansRouter``: ProxRouter whose reference set is K clusters of the training queries (prior n_i / s_i)."""
from __future__ import annotations

import numpy as np

from proxray.routing.index import as_matrix, pairwise_distance, prepare
from proxray.routing.params import METRIC, TEMPERATURE, WEIGHTING, Param as _p
from proxray.routing.prox import ProxRouter, check_targets, cluster_sums
from proxray.routing.temperature import PLUG_IN_C, PlugIn, Temperature
from proxray.routing.weights import bias_variance_stats

# KMeans' hyperparameters (``proxray.routing.params.Param``): the one spec its constructor, ``make_router``, the
# command line, ``check_fit`` and the configuration reference read
PARAMS = {p.name: p for p in (
    _p("n_clusters", int, 32, "KMeans clusters", low=1, high="n", cli="--clusters"),
    WEIGHTING, TEMPERATURE, METRIC,
    _p("prior", str, "spread", "cluster prior: spread (n_i / s_i, the paper's), size (n_i) or uniform",
       choices=("spread", "size", "uniform")),
    _p("random_state", int, 42, "KMeans seed"),
    _p("n_init", int, 3, "KMeans restarts (the best kept)", low=1))}

D = {name: p.default for name, p in PARAMS.items()}
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


class KMeansRouter(ProxRouter):
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

    # the family, described (``ProxRouter``'s attributes; ``routing.registry`` lists the families)
    kind, name, label = "km", "KMeans", "KM"
    PARAMS = PARAMS
    temperatures = ("fixed", "spread", "plug-in")
    base_inv_tau = np.inf  # Base: the nearest cluster
    protocol = "leave-task-out"
    default_outliers = ("hellaswag", "medqa")

    @classmethod
    def auto_temperature(cls) -> Temperature:
        """KMeans' shipped temperature: plug-in:0.125, per query the 1/tau minimizing the bias–variance bound."""
        return PlugIn(PLUG_IN_C)

    @classmethod
    def for_training(cls, params: dict, n_train: int) -> dict:
        """No more clusters than training queries."""
        return {**params, "n_clusters": min(params["n_clusters"], n_train)}

    def __init__(self, n_clusters=D["n_clusters"], weighting=D["weighting"], temperature=D["temperature"],
                 metric=D["metric"], prior=D["prior"], random_state=D["random_state"], n_init=D["n_init"],
                 **deprecated):
        self._store(dict(locals()))

    def fit(self, X, acc, cost=None, models=None, encoder_id=None, query_ids=None, tasks=None):
        """X (n, d) embeddings, acc (n, M) in [0, 1], cost (n, M) >= 0 or None, models M names; query_ids and tasks
        (n,) what the evidence of a decision describes its clusters by (optional)."""
        from sklearn.cluster import KMeans

        X, acc, cost = self._init_common(X, acc, cost, models, encoder_id)
        K = int(self.n_clusters)
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

    def leave_out_estimate(self, R, rows, acc, cost):
        """Estimates (acc_hat, cost_hat) of training queries ``R`` (prepared; rows ``rows`` of the training set, with
        labels ``acc``/``cost``), each with its own labels left out: every cluster weighed, the query's own without it
        (a cluster of one keeps its weight and estimate)."""
        phi, _, prior = self._phi(R)
        w = self.temperature_.weights(phi, prior, self)
        a_hat, c_hat = self.estimate_at(w, None)
        own = self.labels_[rows]
        n = self.sizes_[own][:, None]
        wo = w[np.arange(len(R)), own][:, None]
        gone = n > 1
        a_hat = a_hat + np.where(gone, wo * (self.acc_values_[own] - acc) / np.maximum(n - 1, 1), 0.0)
        c_hat = c_hat + np.where(gone, wo * (self.cost_values_[own] - cost) / np.maximum(n - 1, 1), 0.0)
        return a_hat, c_hat

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
