"""The drift detector: which traffic group a routed query belongs to, and whether it drifted.

Groups are clusters of the training embeddings (× inlier/outlier); a query drifted when its outlier score — the
served router's distance to its reference set — is over the router's own outlier threshold, the one its artifact
holds and ``explain`` shows (``proxray.routing.provenance.outlier_threshold``: a quantile of the router's
``training_outlier_scores`` on its training queries, each left out of the reference): the same distance, computed
the same way, as the one it is compared with.
"""
from __future__ import annotations

import hashlib

import numpy as np


def text_key(prompt: str) -> str:
    """A query's identity in the monitor: the hash of its text (retries and repeats count once)."""
    return hashlib.sha256(str(prompt).encode()).hexdigest()[:20]


def group_name(group: int, drifted: bool) -> str:
    return f"c{group}" + ("*" if drifted else "")


class DriftDetector:
    def __init__(self, router, X_train, n_groups: int):
        from sklearn.cluster import KMeans

        from proxray.routing.index import normalize
        from proxray.routing.provenance import outlier_threshold

        Xn = normalize(np.asarray(X_train, dtype=np.float32))
        self.centers = normalize(KMeans(n_clusters=min(n_groups, len(Xn)), random_state=0, n_init=1)
                                 .fit(Xn).cluster_centers_.astype(np.float32))
        if getattr(router, "outlier_threshold_", None) is None:  # an artifact saved before it kept one
            router.outlier_threshold_ = outlier_threshold(router, X_train)
        self.threshold = float(router.outlier_threshold_)

    def group(self, embedding) -> int:
        """The nearest training cluster of an embedding (d,)."""
        e = np.asarray(embedding, dtype=np.float32)
        return int(np.argmax(self.centers @ (e / max(float(np.linalg.norm(e)), 1e-12))))

    def drifted(self, outlier_score: float) -> bool:
        return bool(outlier_score > self.threshold)
