"""``KNNRouter``: ProxRouter whose reference set is the k nearest training queries (uniform prior)."""
from __future__ import annotations

import numpy as np

from proxray.routing.index import (INDEX_KINDS, MAX_REGRET, RECALL_FLOOR, ROUTE_BUDGET_MS, NeighborIndex, as_matrix,
                                   fit_index, prepare)
from proxray.routing.params import METRIC, TEMPERATURE, WEIGHTING, Param as _p
from proxray.routing.prox import ProxRouter, check_targets
from proxray.routing.temperature import SPREAD_C, Spread, Temperature

# kNN's hyperparameters (``proxray.routing.params.Param``): the one spec its constructor, ``make_router``, the
# command line, ``check_fit`` and the configuration reference read
PARAMS = {p.name: p for p in (
    _p("k", int, 100, "neighbours per query", low=1, high="n", cli="--k"),
    WEIGHTING, TEMPERATURE, METRIC,
    _p("index", str, "auto", "nearest-neighbour search: auto (exact up to 8k references, HNSW above), flat "
       "(exact), ivf or hnsw", choices=INDEX_KINDS),
    _p("max_regret", float, MAX_REGRET, "utility (acc − λ·cost) an approximate index's decisions may lose a "
       "decision against exact search, on held-out references over the λ range (0.005: half an accuracy point; "
       "tables over 8k queries)", low=0.0, high=1.0, cli="--max-regret"),
    _p("route_budget_ms", float, ROUTE_BUDGET_MS, "milliseconds one route (search, estimate, decision) may take on "
       "one thread: auto's index is the fastest within it that meets max_regret, else the least regret within "
       "it (with a warning)", low=0.0, cli="--route-budget-ms"),
    _p("decision_tolerance", float, None, "the share of decisions an approximate index may also change against "
       "exact search (None: regret alone decides)", low=0.0, high=1.0, none=True, cli="--decision-tolerance"),
    _p("recall_floor", float, RECALL_FLOOR, "recall@k against exact search an approximate index must also reach "
       "(0: its decisions alone decide)", low=0.0, high=1.0, cli="--recall-floor"),
    _p("nprobe", int, None, "IVF lists searched; None: the fewest that meet max_regret and recall_floor",
       low=1, none=True),
    _p("nlist", int, None, "IVF lists; None: about 2 sqrt(n)", low=1, none=True),
    _p("hnsw_m", int, 32, "HNSW graph degree", low=2),
    _p("ef_search", int, None, "HNSW search breadth; None: the least that meets max_regret and "
       "recall_floor", low=1, none=True))}

D = {name: p.default for name, p in PARAMS.items()}


class KNNRouter(ProxRouter):
    """k-nearest-neighbour router: reference set = the k nearest training queries.

    Parameters
    ----------
    k : int, neighbours (clipped to the training-set size).
    weighting : "base" (uniform over the k) | "prox" (uniform prior tilted by exp(-phi/tau)).
    temperature : Prox's temperature (``proxray.routing.temperature``): "auto" (default) kNN's shipped one
        (spread:0.2, 1/tau(x) = 0.2 / std of the query's k distances), a number a fixed 1/tau (the paper's 20), or
        a ``Fixed`` / ``Spread`` value or its string ("spread:0.2").
    metric : "cosine" | "euclidean".
    index : "auto" (default: exact search up to 8k references, an HNSW graph above, tuned to max_regret within
        route_budget_ms) | "flat" (exact) | "ivf" | "hnsw" (approximate; see ``proxray.routing.index``).
    max_regret : the utility (acc − λ·cost) an approximate index's decisions may lose, a decision on average, against
        exact search — on references held out of the index, at λ over the range its costs span (``decision_lams``).
        Default 0.005: half an accuracy point. ivf / hnsw by name that cannot meet it are an error.
    route_budget_ms : one route's milliseconds on one thread (default 1): auto picks the fastest setting within it
        that meets max_regret; where none does, exact search if that fits, else the least regret within it, and warns.
    decision_tolerance : None (default), or the share of decisions an approximate index may also change.
    recall_floor : recall@k against exact search an approximate index must also reach. Default 0: decisions decide.
    nprobe : IVF lists searched; None (default) tunes it: the fewest that meet both.
    nlist : IVF lists; None: ~2 sqrt(n). hnsw_m : HNSW graph degree.
    ef_search : HNSW search breadth; None (default) tunes it: the least (64, 96, 144, ...) that meets both.

    Learned: ``acc_values_``, ``cost_values_`` (n_train, M), ``models_``, ``k_``, ``temperature_``,
    ``index_`` (faiss), ``index_info_`` (its kind, parameters and the recall it reached), ``reference_``
    (n_train, d) prepared embeddings.
    """

    # the family, described (``ProxRouter``'s attributes; ``routing.registry`` lists the families)
    kind, name, label = "knn", "kNN", "kNN"
    PARAMS = PARAMS
    temperatures = ("fixed", "spread")
    base_inv_tau = 0.0  # Base: uniform over the k
    protocol = "few-shot-outlier"
    default_outliers = ("gsm8k", "svamp")

    @classmethod
    def auto_temperature(cls) -> Temperature:
        """kNN's shipped temperature: spread:0.2, 1/tau(x) = 0.2 / std of the query's k distances."""
        return Spread(SPREAD_C)

    @classmethod
    def fit_bytes_per_query(cls, dim: int) -> int:
        """An HNSW graph's vectors and links, per training query."""
        return dim * 4 + PARAMS["hnsw_m"].default * 2 * 4 * 2

    def __init__(self, k=D["k"], weighting=D["weighting"], temperature=D["temperature"], metric=D["metric"],
                 index=D["index"], max_regret=D["max_regret"], route_budget_ms=D["route_budget_ms"],
                 decision_tolerance=D["decision_tolerance"], recall_floor=D["recall_floor"],
                 nprobe=D["nprobe"], nlist=D["nlist"], hnsw_m=D["hnsw_m"], ef_search=D["ef_search"], **deprecated):
        self._store(dict(locals()))

    def fit(self, X, acc, cost=None, models=None, encoder_id=None, query_ids=None, tasks=None):
        """X (n, d) embeddings, acc (n, M) in [0, 1], cost (n, M) >= 0 or None, models M names; query_ids and tasks
        (n,) what the evidence of a decision names its neighbours by (optional)."""
        X, acc, cost = self._init_common(X, acc, cost, models, encoder_id)
        self.acc_values_, self.cost_values_ = acc, cost
        self._values = None
        self.reference_ = prepare(X, self.metric)
        self._build_index()
        self._note_training(X, query_ids, tasks)
        return self

    def _build_index(self):
        def estimate(dist, idx):  # this router's estimate from given neighbours
            return self._values_at(self.temperature_.weights(dist, None, self), idx)

        decisions = (estimate, decision_lams(self.cost_values_)) if hasattr(self, "temperature_") else None
        self.index_, self.index_info_ = fit_index(self.reference_, self.metric, self.index, self.k_,
                                                  float(self.recall_floor), self.nprobe, self.nlist, self.hnsw_m,
                                                  self.ef_search, decisions=decisions,
                                                  max_regret=float(getattr(self, "max_regret", MAX_REGRET)),
                                                  budget_ms=float(getattr(self, "route_budget_ms", ROUTE_BUDGET_MS)),
                                                  tolerance=getattr(self, "decision_tolerance", None))

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

    def leave_out_estimate(self, R, rows, acc, cost):
        """Estimates (acc_hat, cost_hat) of training queries ``R`` (prepared; rows ``rows`` of the references, with
        labels ``acc``/``cost``), each with its own labels left out: the k nearest *other* references."""
        dist, idx = self.index_.search(R, min(self.k_ + 1, self.n_train_))
        own = idx == rows[:, None]
        keep = ~own
        keep[~own.any(1), -1] = False  # itself not found among the k + 1: drop the farthest instead
        phi = dist[keep].reshape(len(R), -1)
        ref = idx[keep].reshape(len(R), -1)
        return self.estimate_at(self.temperature_.weights(phi, None, self), ref)

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


def decision_lams(cost) -> np.ndarray:
    """The λ an index's decisions are checked at: 0 and 15 values from where cost weighs 1 % of accuracy to where it
    weighs 10× (λ · mean cost from 0.01 to 10, geometric) — the range a routing curve sweeps. No cost: λ = 0 alone."""
    c = float(np.mean(cost)) if cost is not None and np.size(cost) else 0.0
    return np.concatenate([[0.0], np.geomspace(0.01, 10.0, 15) / c]) if c > 0 else np.zeros(1)

