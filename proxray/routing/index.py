"""Distances and nearest-neighbour search over embeddings (faiss).

phi, the proximity penalty of the paper, is a distance here:

* ``cosine``: 1 - cos(x, r), in [0, 2]. Vectors are L2-normalized first, so a faiss inner-product
  index gives it exactly.
* ``euclidean``: ||x - r||.

``NeighborIndex`` wraps an exact faiss index or an approximate one (``ivf``: an inverted file over a flat
quantizer, trained on a sample; ``hnsw``: a graph) for large reference sets; ``recall_at_k`` measures what the
approximation loses against the exact search. ``fit_index`` builds the one a router asks for — ``auto`` (the
default): exact up to ``EXACT_MAX`` references, an inverted file above, its lists set from the size and the lists
it searches (``nprobe``) the fewest that reach the recall floor on a sample of the references — and reports the
recall it reached.

One query searches on one thread best: faiss's OpenMP threads cost more than they give there (1M exact
references: 112 ms on one thread, 224 ms on the machine's two). ``single_thread()`` is what the router's serving
replicas call on the thread that routes (OpenMP's thread count is per thread: an encoder's threads elsewhere keep
theirs); fitting and batch scoring (the monitor) keep faiss's threads.
"""
from __future__ import annotations

import numpy as np

METRICS = ("cosine", "euclidean")
INDEX_KINDS = ("auto", "flat", "ivf", "hnsw")
EXACT_MAX = 8_000  # auto: exact search up to this many references, ~1 ms on one thread (bench/bench_scale.py: 1.2 ms
# at 10k, while HNSW routes 100k in 0.75 ms and 1M in 0.85 ms)
RECALL_FLOOR = 0.0  # the recall@k an approximate index must also reach against exact search (0: decisions alone)
RECALL_SAMPLE = 256  # references held out of the index, then asked for their neighbours, to measure it
DECISION_SAMPLE = 512  # the same, where the router's decisions are what is measured (× its λ range)
DECISION_TOL = 0.005  # the share of held decisions an approximate index may route differently from exact search
TRAIN_PER_LIST = 40  # IVF: training sample per list (faiss warns below 39)
AUTO_APPROX = "hnsw"  # auto's index above EXACT_MAX (bench/bench_scale.py: at 1M, ivf needs 3.6 ms for recall 0.95)
MIN_EF_SEARCH, MAX_EF_SEARCH = 64, 1024  # HNSW: the search breadths tuning tries (× 1.5 a step)
EF_CONSTRUCTION = 32  # HNSW build breadth (faiss: 40): at 1M references 32 builds in ~3/4 of the time


def single_thread() -> None:
    """One OpenMP thread for faiss's searches from the calling thread (OpenMP's count is per thread; torch's
    threads share it, so call it on the thread that searches, not where an encoder runs): what a one-query search
    wants."""
    import faiss

    faiss.omp_set_num_threads(1)


def ivf_lists(n: int) -> int:
    """Inverted lists for ``n`` references: ~2 sqrt(n), at least 16, at most 8192."""
    return int(np.clip(round(2 * np.sqrt(n)), 16, 8192))


def check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r}: allowed values are {', '.join(METRICS)}")
    return metric


def as_matrix(X, name: str = "X", dim: int | None = None) -> np.ndarray:
    """Validate an embedding matrix: (n, d) finite float32, C-contiguous (what faiss wants)."""
    X = np.ascontiguousarray(X, dtype=np.float32)
    if X.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d), got shape {X.shape}")
    if dim is not None and X.shape[1] != dim:
        raise ValueError(f"{name} has dimension {X.shape[1]}, the router was fitted on dimension {dim}")
    if not np.isfinite(X).all():
        raise ValueError(f"{name} contains NaN or inf")
    return X


def normalize(X: np.ndarray) -> np.ndarray:
    """L2-normalize rows; a zero row stays zero (its cosine distance to anything is 1)."""
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return (X / np.where(norms > 0, norms, 1.0)).astype(np.float32, copy=False)


def prepare(X: np.ndarray, metric: str) -> np.ndarray:
    """The representation searched for a metric: unit rows for cosine, raw rows for euclidean."""
    return normalize(X) if metric == "cosine" else X


def pairwise_distance(Xq: np.ndarray, R: np.ndarray, metric: str) -> np.ndarray:
    """Dense distances (q, n) between prepared queries (q, d) and prepared references (n, d)."""
    if metric == "cosine":
        return np.clip(1.0 - Xq @ R.T, 0.0, 2.0)
    sq = (Xq * Xq).sum(1)[:, None] - 2.0 * (Xq @ R.T) + (R * R).sum(1)[None, :]
    return np.sqrt(np.maximum(sq, 0.0))


class NeighborIndex:
    """k-nearest-neighbour search returning distances in the chosen metric.

    Parameters: ``metric`` (cosine | euclidean), ``kind`` (flat | ivf | hnsw), ``nprobe`` (IVF lists
    searched), ``nlist`` (IVF lists; default from the size, ``ivf_lists``), ``hnsw_m`` (graph degree),
    ``ef_search`` (HNSW search breadth), ``seed`` (the IVF training sample).
    """

    def __init__(self, dim: int, metric: str = "cosine", kind: str = "flat", nprobe: int = 16,
                 hnsw_m: int = 32, ef_search: int = 128, nlist: int | None = None, seed: int = 0):
        import faiss

        check_metric(metric)
        if kind not in INDEX_KINDS or kind == "auto":
            raise ValueError(f"index={kind!r}: allowed values are {', '.join(k for k in INDEX_KINDS if k != 'auto')}")
        self.dim, self.metric, self.kind = dim, metric, kind
        self.nprobe, self.hnsw_m, self.ef_search, self.nlist, self.seed = nprobe, hnsw_m, ef_search, nlist, seed
        fmetric = faiss.METRIC_INNER_PRODUCT if metric == "cosine" else faiss.METRIC_L2
        self._fmetric = fmetric
        if kind == "flat":
            self._index = faiss.IndexFlatIP(dim) if metric == "cosine" else faiss.IndexFlatL2(dim)
        elif kind == "hnsw":  # in an id map: references can be added out of order (a held sample last)
            self._graph = faiss.IndexHNSWFlat(dim, hnsw_m, fmetric)
            self._graph.hnsw.efConstruction = EF_CONSTRUCTION
            self._graph.hnsw.efSearch = ef_search
            self._index = faiss.IndexIDMap(self._graph)
        else:
            self._index = None  # built at the first add, when n is known

    @property
    def ntotal(self) -> int:
        return 0 if self._index is None else int(self._index.ntotal)

    def add(self, R: np.ndarray, ids: np.ndarray | None = None) -> None:
        """Add prepared reference vectors (n, d), numbered ``ids`` (default: after those it has; an approximate
        index only). An IVF index is trained at the first add, on a sample of it (``TRAIN_PER_LIST`` per list);
        later adds go into the lists it has (no retraining)."""
        import faiss

        if self._index is None:
            self.nlist = int(min(self.nlist or ivf_lists(len(R)), max(1, len(R) // TRAIN_PER_LIST)))
            quantizer = faiss.IndexFlatIP(self.dim) if self.metric == "cosine" else faiss.IndexFlatL2(self.dim)
            self._index = faiss.IndexIVFFlat(quantizer, self.dim, self.nlist, self._fmetric)
            self._quantizer = quantizer
            n_train = min(len(R), TRAIN_PER_LIST * self.nlist)
            pick = np.random.default_rng(self.seed).choice(len(R), n_train, replace=False) if n_train < len(R) else None
            self._index.train(R if pick is None else R[np.sort(pick)])
            self.set_nprobe(self.nprobe)
        if self.kind == "flat":
            if ids is not None:
                raise ValueError("an exact index numbers its references in order")
            self._index.add(R)
        else:
            ids = np.arange(self.ntotal, self.ntotal + len(R)) if ids is None else ids
            self._index.add_with_ids(R, np.ascontiguousarray(ids, dtype=np.int64))

    def set_nprobe(self, nprobe: int) -> None:
        self.nprobe = int(nprobe)
        if self.kind == "ivf" and self._index is not None:
            self._index.nprobe = min(self.nprobe, self.nlist)

    def set_ef_search(self, ef: int) -> None:
        self.ef_search = int(ef)
        if self.kind == "hnsw":
            self._graph.hnsw.efSearch = self.ef_search

    def widen(self) -> bool:
        """Search more of an approximate index (IVF: twice the lists, HNSW: 1.5 times the breadth, up to
        ``MAX_EF_SEARCH``); False when it searches all it can."""
        if self.kind == "ivf" and self.nprobe < self.nlist:
            self.set_nprobe(min(2 * self.nprobe, self.nlist))
            return True
        if self.kind == "hnsw" and self.ef_search < MAX_EF_SEARCH:
            self.set_ef_search(min(int(1.5 * self.ef_search), MAX_EF_SEARCH))
            return True
        return False

    def params(self) -> dict:
        """What the artifact records of it."""
        if self.kind == "ivf":
            return {"kind": "ivf", "nlist": self.nlist, "nprobe": min(self.nprobe, self.nlist or self.nprobe)}
        if self.kind == "hnsw":
            return {"kind": "hnsw", "hnsw_m": self.hnsw_m, "ef_search": self.ef_search}
        return {"kind": "flat"}

    def to_bytes(self) -> np.ndarray:
        """The index as faiss writes it (uint8), for the artifact: loading it reads, never rebuilds."""
        import faiss

        return faiss.serialize_index(self._index)

    @classmethod
    def from_bytes(cls, data: np.ndarray, dim: int, metric: str, params: dict) -> "NeighborIndex":
        import faiss

        kind = params.get("kind", "flat")
        idx = cls(dim, metric, kind, **{k: v for k, v in params.items() if k in ("nprobe", "nlist", "hnsw_m", "ef_search")})
        idx._index = faiss.deserialize_index(np.ascontiguousarray(data, dtype=np.uint8))
        if idx._index.d != dim:
            raise ValueError(f"the stored index has dimension {idx._index.d}, the router {dim}")
        if kind == "ivf":
            idx.nlist = int(idx._index.nlist)
            idx.set_nprobe(params.get("nprobe", idx.nprobe))
        elif kind == "hnsw":
            idx._graph = faiss.downcast_index(idx._index.index)  # the id map owns it
            idx._graph.hnsw.efSearch = idx.ef_search
        return idx

    def search(self, Xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Return (distances (q, k) float64, indices (q, k) int64); missing neighbours: inf, -1."""
        sims, idx = self._index.search(Xq, k)
        sims = sims.astype(np.float64)
        if self.metric == "cosine":
            dist = np.clip(1.0 - sims, 0.0, 2.0)
        else:
            dist = np.sqrt(np.maximum(sims, 0.0))
        dist[idx < 0] = np.inf
        return dist, idx.astype(np.int64)


def exact_neighbours(Xq: np.ndarray, R: np.ndarray, k: int, metric: str, distances: bool = False):
    """Indices (q, k) of the exact k nearest references (faiss's brute force, no index copy of R); with ``distances``,
    (distances (q, k) as ``NeighborIndex.search`` gives them, indices)."""
    import faiss

    sims, idx = faiss.knn(Xq, R, k, metric=faiss.METRIC_INNER_PRODUCT if metric == "cosine" else faiss.METRIC_L2)
    if not distances:
        return idx
    sims = sims.astype(np.float64)
    dist = np.clip(1.0 - sims, 0.0, 2.0) if metric == "cosine" else np.sqrt(np.maximum(sims, 0.0))
    return dist, idx.astype(np.int64)


class DecisionCheck:
    """How an approximate index's neighbours change a router's *decisions* against exact search, on held queries:
    ``estimate(dist, idx)`` is the router's (acc_hat, cost_hat) from neighbours, ``lams`` the λ range it routes at.
    ``disagreement``: the share of (query, λ) whose chosen model differs from exact search's; ``regret``: the mean
    utility (acc − λ·cost, by the exact estimates) those changes lose."""

    def __init__(self, estimate, lams, exact_dist, exact_idx):
        self.estimate, self.lams = estimate, np.asarray(lams, dtype=np.float64)
        acc, cost = estimate(exact_dist, exact_idx)
        self.u = np.stack([acc - lam * cost for lam in self.lams], 1)  # (q, L, M) by exact estimates
        self.pick = self._choose(acc, cost)

    def _choose(self, acc, cost) -> np.ndarray:
        from proxray.routing.objective import choose

        return np.stack([choose(acc, cost, lam) for lam in self.lams], 1)  # (q, L)

    def measure(self, dist, idx) -> tuple[float, float]:
        pick = self._choose(*self.estimate(dist, idx))
        q, L = np.indices(pick.shape)
        regret = self.u[q, L, self.pick] - self.u[q, L, pick]
        return float(np.mean(pick != self.pick)), float(np.mean(regret))


def fit_index(R: np.ndarray, metric: str, kind: str, k: int, floor: float = RECALL_FLOOR, nprobe: int | None = None,
              nlist: int | None = None, hnsw_m: int = 32, ef_search: int | None = None, seed: int = 0,
              decisions=None, tolerance: float = DECISION_TOL):
    """The index a router searches ``R`` (n, d, prepared) with, and what the artifact records of it: its params, and
    for an approximate one the recall@k reached on a sample — and, with ``decisions`` ((estimate, lams): the router's
    estimate from neighbours and its λ range), how far its decisions are from exact search's there
    (``DecisionCheck``). ``auto``: exact up to ``EXACT_MAX`` references, else ``AUTO_APPROX``. An approximate index
    whose search knob is not given (IVF ``nprobe``, HNSW ``ef_search``) searches the least (1, 2, 4, ... lists; 64, 96,
    144, ... breadth) that reaches ``floor`` and routes at most ``tolerance`` of the held decisions differently; where
    nothing does, auto falls back to exact search and a kind asked for by name is an error naming the fix."""
    n, d = R.shape
    if kind == "auto" and n <= EXACT_MAX or kind == "flat":
        index = NeighborIndex(d, metric, "flat")
        index.add(R)
        return index, {"kind": "flat", "recall_at_k": 1.0, "k": k, "chosen": "exact" if kind == "flat" else
                       f"auto: {n} references <= {EXACT_MAX}"}
    approx = AUTO_APPROX if kind == "auto" else kind
    tune = (nprobe if approx == "ivf" else ef_search) is None
    index = NeighborIndex(d, metric, approx, nprobe=nprobe or 1, hnsw_m=hnsw_m, ef_search=ef_search or MIN_EF_SEARCH,
                          nlist=nlist, seed=seed)
    # a held sample of the references: the index is built without it, asked for its neighbours, then given it
    held = np.zeros(n, bool)
    held[np.random.default_rng(seed).choice(n, min(RECALL_SAMPLE if decisions is None else DECISION_SAMPLE, n // 10),
                                            replace=False)] = True
    rest = np.flatnonzero(~held)
    index.add(R[rest], rest)
    Q = R[held]
    kk = min(k, len(rest))
    exact_dist, exact = exact_neighbours(Q, R[rest], kk, metric, distances=True)
    exact = rest[exact]
    check = None if decisions is None else DecisionCheck(decisions[0], decisions[1], exact_dist, exact)

    def measure():
        dist, idx = index.search(Q, kk)
        recall = recall_at_k(idx, exact)
        return (recall, *check.measure(dist, idx)) if check else (recall, 0.0, 0.0)

    recall, differ, regret = measure()
    while tune and (recall < floor or differ > tolerance) and index.widen():
        recall, differ, regret = measure()
    index.add(Q, np.flatnonzero(held))
    info = {**index.params(), "recall_at_k": round(float(recall), 4), "k": k, "floor": floor,
            "sample": len(Q), "chosen": f"auto: {n} references > {EXACT_MAX}" if kind == "auto" else approx}
    if check is not None:
        info.update(decisions_differ=round(differ, 5), decision_regret=round(regret, 6), tolerance=tolerance,
                    lams=len(check.lams))
    if recall >= floor and differ <= tolerance:
        return index, info
    what = (f"recall@{k} against exact search is {recall:.3f} on {len(Q)} held-out references, below recall_floor="
            f"{floor}" if recall < floor else f"{differ:.2%} of the decisions on {len(Q)} held-out references × "
            f"{len(check.lams)} λ routed differently from exact search's, above decision_tolerance={tolerance}")
    if kind == "auto":
        index = NeighborIndex(d, metric, "flat")
        index.add(R)
        return index, {"kind": "flat", "recall_at_k": 1.0, "k": k, "chosen": f"auto: {approx} reached {what} "
                       "at its widest search; exact search instead", **({"decisions_differ": 0.0} if check else {})}
    knob = {"ivf": "nprobe", "hnsw": "ef_search"}[approx]
    raise ValueError(f"index={kind!r}: {what}; raise {knob} (or leave it unset: tuned), use index='auto' or 'flat', "
                     "or lower recall_floor / raise decision_tolerance")


def recall_at_k(approx_idx: np.ndarray, exact_idx: np.ndarray) -> float:
    """Fraction of the exact k nearest neighbours that the approximate search also returned."""
    hits = sum(len(np.intersect1d(a[a >= 0], e[e >= 0])) for a, e in zip(approx_idx, exact_idx))
    return hits / max(1, int((exact_idx >= 0).sum()))


def describe_index(info: dict | None) -> str | None:
    """What a kNN router's artifact records of its index, in one line (``fit`` and ``info`` print it)."""
    if not info:
        return None
    knobs = ", ".join(f"{k}={info[k]}" for k in ("nlist", "nprobe", "hnsw_m", "ef_search") if k in info)
    decided = (f", decisions {info['decisions_differ']:.2%} different from exact search's (regret "
               f"{info.get('decision_regret', 0.0):.2g}, tolerance {info.get('tolerance', 0):.2%}, {info.get('sample')} "
               f"held-out references × {info.get('lams')} λ)" if "decisions_differ" in info and "tolerance" in info else "")
    return (f"index: {info['kind']}{f' ({knobs})' if knobs else ''}, recall@{info['k']} {info['recall_at_k']} against "
            f"exact search{decided} — {info['chosen']}")
