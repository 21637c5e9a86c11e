"""Distances and nearest-neighbour search over embeddings (faiss).

phi, the proximity penalty of the paper, is a distance here:

* ``cosine``: 1 - cos(x, r), in [0, 2]. Vectors are L2-normalized first, so a faiss inner-product
  index gives it exactly.
* ``euclidean``: ||x - r||.

``NeighborIndex`` wraps an exact faiss index or an approximate one (``ivf``: an inverted file over a flat
quantizer, trained on a sample; ``hnsw``: a graph) for large reference sets; ``recall_at_k`` measures what the
approximation loses against the exact search. ``fit_index`` builds the one a router asks for — ``auto`` (the
default): exact up to ``EXACT_MAX`` references, an HNSW graph above whose search breadth is the least that keeps the
router's decisions within ``MAX_REGRET`` of exact search's (the utility its changed decisions lose, ``DecisionCheck``,
on references held out while it is built) within ``ROUTE_BUDGET_MS`` a route on one thread — and records what it
reached and what it tried.

One query searches on one thread best: faiss's OpenMP threads cost more than they give there (1M exact
references: 112 ms on one thread, 224 ms on the machine's two). ``single_thread()`` is what the router's serving
replicas call on the thread that routes (OpenMP's thread count is per thread: an encoder's threads elsewhere keep
theirs); fitting and batch scoring (the monitor) keep faiss's threads.
"""
from __future__ import annotations

import warnings

import numpy as np

METRICS = ("cosine", "euclidean")
INDEX_KINDS = ("auto", "flat", "ivf", "hnsw")
EXACT_MAX = 8_000  # auto: exact search up to this many references, ~1 ms on one thread (bench/bench_scale.py: 1.2 ms
# at 10k, while HNSW routes 100k in 0.75 ms and 1M in 0.85 ms)
RECALL_FLOOR = 0.0  # the recall@k an approximate index must also reach against exact search (0: decisions alone)
RECALL_SAMPLE = 256  # references held out of the index, then asked for their neighbours, to measure it
DECISION_SAMPLE = 512  # the same, where the router's decisions are what is measured (× its λ range)
MAX_REGRET = 0.005  # utility (acc − λ·cost) an approximate index's changed decisions may lose a decision, on average
# over held references × the λ range, against exact search: half an accuracy point of the router's objective
ROUTE_BUDGET_MS = 1.0  # one query's route (search, estimate, decision) on one thread that auto's index must stay under
LATENCY_SAMPLE = 64  # held references timed one at a time for it
TRAIN_PER_LIST = 40  # IVF: training sample per list (faiss warns below 39)
AUTO_APPROX = "hnsw"  # auto's index above EXACT_MAX (bench/bench_scale.py: at 1M, ivf needs 3.6 ms for recall 0.95)
MIN_EF_SEARCH, MAX_EF_SEARCH = 64, 1024  # HNSW: the search breadths tuning tries (× 1.5 a step)
HNSW_M = 32  # HNSW graph degree
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

    def route(self, dist, idx) -> np.ndarray:
        """What one route does with neighbours: the estimate and the choice (at the middle of the λ range)."""
        from proxray.routing.objective import choose

        return choose(*self.estimate(dist, idx), self.lams[len(self.lams) // 2])

    def measure(self, dist, idx) -> tuple[float, float]:
        pick = self._choose(*self.estimate(dist, idx))
        q, L = np.indices(pick.shape)
        regret = self.u[q, L, self.pick] - self.u[q, L, pick]
        return float(np.mean(pick != self.pick)), float(np.mean(regret))


def _route_times(search, Q: np.ndarray, k: int, check: "DecisionCheck | None", stop_ms: float | None = None) -> list:
    """Seconds of each query of ``Q`` routed one at a time on one faiss thread: ``search(q, k)`` and, with ``check``,
    the router's estimate and choice from its neighbours; stopped after three once they sum past ``stop_ms``."""
    import time

    import faiss

    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        times = []
        for q in Q:
            t = time.perf_counter()
            dist, idx = search(q[None, :], k)
            if check is not None:
                check.route(dist, idx)
            times.append(time.perf_counter() - t)
            if stop_ms is not None and len(times) >= 3 and sum(times) * 1e3 > stop_ms:
                break
    finally:
        faiss.omp_set_num_threads(threads)
    return times


def route_ms(index: NeighborIndex, Q: np.ndarray, k: int, check: "DecisionCheck | None" = None) -> float:
    """Median milliseconds of one query's route through ``index`` on one thread — the search, and with ``check`` the
    router's estimate and choice from its neighbours — over the rows of ``Q`` (the first tenth warms caches)."""
    times = _route_times(index.search, Q, k, check)
    return float(np.median(times[max(1, len(times) // 10):])) * 1e3


def exact_route_ms(R: np.ndarray, Q: np.ndarray, k: int, metric: str, budget_ms: float,
                   check: "DecisionCheck | None" = None) -> float:
    """``route_ms`` of exact search over ``R`` (faiss's brute force, no copy of R), from up to ``LATENCY_SAMPLE``
    queries — fewer where the first already take many times ``budget_ms``."""
    times = _route_times(lambda q, kk: exact_neighbours(q, R, kk, metric, distances=True), Q[:LATENCY_SAMPLE], k,
                         check, stop_ms=20 * budget_ms)
    return float(np.median(times)) * 1e3


def fit_index(R: np.ndarray, metric: str, kind: str, k: int, floor: float = RECALL_FLOOR, nprobe: int | None = None,
              nlist: int | None = None, hnsw_m: int = HNSW_M, ef_search: int | None = None, seed: int = 0,
              decisions=None, max_regret: float = MAX_REGRET, budget_ms: float = ROUTE_BUDGET_MS,
              tolerance: float | None = None):
    """The index a router searches ``R`` (n, d, prepared) with, and what the artifact records of it (``info``).

    ``auto``: exact search up to ``EXACT_MAX`` references; above, ``AUTO_APPROX`` whose search knob (IVF ``nprobe``:
    1, 2, 4, ... lists; HNSW ``ef_search``: 64, 96, 144, ... breadth), where not given, is the least that keeps the
    router's decisions within ``max_regret`` of exact search's — with ``decisions`` ((estimate, lams): the router's
    estimate from neighbours and its λ range), the mean utility (acc − λ·cost, by the exact estimates) its changed
    decisions lose on references held out of the index while it is built (``DecisionCheck``) — and reaches ``floor``
    recall@k (and, where given, changes at most ``tolerance`` of the decisions), within ``budget_ms`` a route on one
    thread (``route_ms``). Where no setting does both: exact search if it fits the budget, else the least regret under
    the budget (or, where nothing is under it, the fastest setting that meets the bound, else the least regret) — with
    a warning, in ``info["warning"]`` too. An index asked for by name is tuned to the bound whatever its latency, and is
    an error naming the fix where its widest search misses it; ``flat`` is exact search at any size."""
    n, d = R.shape
    if kind == "auto" and n <= EXACT_MAX or kind == "flat":
        index = NeighborIndex(d, metric, "flat")
        index.add(R)
        return index, {"kind": "flat", "recall_at_k": 1.0, "k": k, "chosen": "exact" if kind == "flat" else
                       f"auto: {n} references <= {EXACT_MAX}"}
    approx = AUTO_APPROX if kind == "auto" else kind
    knob = {"ivf": "nprobe", "hnsw": "ef_search"}[approx]
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
    trials = []

    def trial() -> dict:
        dist, idx = index.search(Q, kk)
        differ, regret = check.measure(dist, idx) if check else (0.0, 0.0)
        t = {knob: int(index.params()[knob]), "recall_at_k": round(recall_at_k(idx, exact), 4),
             "decisions_differ": round(differ, 5), "decision_regret": round(regret, 6),
             "route_ms": round(route_ms(index, Q[:LATENCY_SAMPLE], kk, check), 3)}
        trials.append(t)
        return t

    def meets(t: dict) -> bool:
        return t["recall_at_k"] >= floor and t["decision_regret"] <= max_regret and (
            tolerance is None or t["decisions_differ"] <= tolerance)

    t = trial()
    while tune and not meets(t) and (kind != "auto" or t["route_ms"] <= budget_ms) and index.widen():
        t = trial()
    bound = (f"regret <= {max_regret:g}" + (f", recall@{k} >= {floor:g}" if floor else "")
             + (f", decisions differing <= {tolerance:g}" if tolerance is not None else ""))
    chosen, warning = t, None
    if kind != "auto" and not meets(t):
        what = (f"recall@{k} {t['recall_at_k']:.3f}" if t["recall_at_k"] < floor else f"regret {t['decision_regret']:.2g}"
                f" ({t['decisions_differ']:.2%} of the decisions changed)")
        raise ValueError(f"index={kind!r}: on {len(Q)} held-out references{f' × {len(check.lams)} λ' if check else ''} "
                         f"it reached {what} against exact search, not {bound}; raise {knob} (or leave it unset: tuned), "
                         "use index='auto' or 'flat', or raise max_regret / lower recall_floor")
    if kind == "auto":  # the fastest within the budget that meets the bound, exact search (no regret) among them
        exact_ms = round(exact_route_ms(R, Q, kk, metric, budget_ms, check), 3)
        fits = meets(t) and t["route_ms"] <= budget_ms
        if exact_ms <= budget_ms and (not fits or exact_ms < t["route_ms"]):
            index = NeighborIndex(d, metric, "flat")
            index.add(R)
            return index, {"kind": "flat", "recall_at_k": 1.0, "k": k, "route_ms": exact_ms, "budget_ms": budget_ms,
                           "max_regret": max_regret, "trials": trials, "chosen": f"auto: exact search takes {exact_ms:g}"
                           f" ms, {'faster than' if fits else 'and no'} {approx} setting {'that meets' if fits else 'met'}"
                           f" {bound}"}
        if not fits:
            under = [x for x in trials if x["route_ms"] <= budget_ms]
            met = [x for x in trials if meets(x)]
            chosen = (min(under, key=lambda x: (x["decision_regret"], x["route_ms"])) if under else
                      min(met, key=lambda x: x["route_ms"]) if met else min(trials, key=lambda x: x["decision_regret"]))
            warning = (f"no {approx} setting met {bound} within {budget_ms:g} ms a route (exact search: {exact_ms:g} "
                       "ms); " + (f"the least regret under the budget: {knob}={chosen[knob]}, regret "
                                  f"{chosen['decision_regret']:.2g}" if under else f"nothing is under the budget: "
                                  f"{knob}={chosen[knob]}, {chosen['route_ms']:g} ms, regret {chosen['decision_regret']:.2g}")
                       + " — raise max_regret or route_budget_ms, or use index='flat' or a KMeansRouter")
            warnings.warn(f"KNNRouter index: {warning}", UserWarning, stacklevel=4)
            (index.set_nprobe if approx == "ivf" else index.set_ef_search)(chosen[knob])
    index.add(Q, np.flatnonzero(held))
    info = {**index.params(), "recall_at_k": chosen["recall_at_k"], "k": k, "floor": floor, "sample": len(Q),
            "route_ms": chosen["route_ms"], "budget_ms": budget_ms,
            "chosen": f"auto: {n} references > {EXACT_MAX}" if kind == "auto" else approx}
    if check is not None:
        info.update(decisions_differ=chosen["decisions_differ"], decision_regret=chosen["decision_regret"],
                    max_regret=max_regret, lams=len(check.lams), trials=trials,
                    **({"tolerance": tolerance} if tolerance is not None else {}))
    if warning:
        info["warning"] = warning
    return index, info


def recall_at_k(approx_idx: np.ndarray, exact_idx: np.ndarray) -> float:
    """Fraction of the exact k nearest neighbours that the approximate search also returned."""
    hits = sum(len(np.intersect1d(a[a >= 0], e[e >= 0])) for a, e in zip(approx_idx, exact_idx))
    return hits / max(1, int((exact_idx >= 0).sum()))


def describe_index(info: dict | None) -> str | None:
    """What a kNN router's artifact records of its index, in one line (``fit`` and ``info`` print it), and its
    warning on a second line where it has one."""
    if not info:
        return None
    knobs = ", ".join(f"{k}={info[k]}" for k in ("nlist", "nprobe", "hnsw_m", "ef_search") if k in info)
    parts = [f"index: {info['kind']}{f' ({knobs})' if knobs else ''}"]
    if info.get("route_ms") is not None:
        parts.append(f"route {info['route_ms']:g} ms on one thread (budget {info.get('budget_ms', ROUTE_BUDGET_MS):g})")
    if "decision_regret" in info:
        bound = f", bound {100 * info['max_regret']:g}" if "max_regret" in info else ""
        parts.append(f"regret {100 * info['decision_regret']:.3g} accuracy points{bound}, "
                     f"{info.get('decisions_differ', 0.0):.2%} of decisions changed against exact search "
                     f"({info.get('sample')} held-out references × {info.get('lams')} λ)")
    if info.get("recall_at_k") is not None and info.get("k") is not None:
        parts.append(f"recall@{info['k']} {info['recall_at_k']}")
    line = ", ".join(parts) + (f" — {info['chosen']}" if info.get("chosen") else "")
    return line + (f"\nwarning: {info['warning']}" if info.get("warning") else "")
