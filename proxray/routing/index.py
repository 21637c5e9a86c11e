"""Distances and nearest-neighbour search over embeddings (faiss).

phi, the proximity penalty of the paper, is a distance here:

* ``cosine``: 1 - cos(x, r), in [0, 2]. Vectors are L2-normalized first, so a faiss inner-product
  index gives it exactly.
* ``euclidean``: ||x - r||.

``NeighborIndex`` wraps an exact faiss index (the default) or an approximate one (``ivf``: an
inverted file over a flat quantizer, ``hnsw``: a graph) for large reference sets; ``recall_at_k``
measures what the approximation loses against the exact search.
"""
from __future__ import annotations

import numpy as np

METRICS = ("cosine", "euclidean")
INDEX_KINDS = ("flat", "ivf", "hnsw")


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
    searched), ``hnsw_m`` (graph degree), ``ef_search`` (HNSW search breadth).
    """

    def __init__(self, dim: int, metric: str = "cosine", kind: str = "flat", nprobe: int = 16,
                 hnsw_m: int = 32, ef_search: int = 128):
        import faiss

        check_metric(metric)
        if kind not in INDEX_KINDS:
            raise ValueError(f"index={kind!r}: allowed values are {', '.join(INDEX_KINDS)}")
        self.dim, self.metric, self.kind = dim, metric, kind
        self.nprobe, self.hnsw_m, self.ef_search = nprobe, hnsw_m, ef_search
        fmetric = faiss.METRIC_INNER_PRODUCT if metric == "cosine" else faiss.METRIC_L2
        if kind == "flat":
            self._index = faiss.IndexFlatIP(dim) if metric == "cosine" else faiss.IndexFlatL2(dim)
        elif kind == "hnsw":
            self._index = faiss.IndexHNSWFlat(dim, hnsw_m, fmetric)
            self._index.hnsw.efSearch = ef_search
        else:
            self._quantizer = faiss.IndexFlatIP(dim) if metric == "cosine" else faiss.IndexFlatL2(dim)
            self._index = None  # built at the first add, when n is known (nlist ~ 4 sqrt(n))
            self._fmetric = fmetric

    @property
    def ntotal(self) -> int:
        return 0 if self._index is None else int(self._index.ntotal)

    def add(self, R: np.ndarray) -> None:
        """Add prepared reference vectors (n, d)."""
        import faiss

        if self._index is None:  # IVF: train once, on the first batch
            nlist = int(max(1, min(4 * np.sqrt(len(R)), len(R) // 39)))
            self._index = faiss.IndexIVFFlat(self._quantizer, self.dim, nlist, self._fmetric)
            self._index.train(R)
            self._index.nprobe = min(self.nprobe, nlist)
        self._index.add(R)

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


def recall_at_k(approx_idx: np.ndarray, exact_idx: np.ndarray) -> float:
    """Fraction of the exact k nearest neighbours that the approximate search also returned."""
    hits = sum(len(np.intersect1d(a[a >= 0], e[e >= 0])) for a, e in zip(approx_idx, exact_idx))
    return hits / max(1, int((exact_idx >= 0).sum()))
