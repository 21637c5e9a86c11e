"""The one registry of router classes: what the command line, the experiments, artifacts, serving and the monitor
name a router by ("km", "knn", or the class name) and how they make and load one."""
from __future__ import annotations

from proxray.routing import artifact
from proxray.routing.baselines import LargestRouter, MLPRouter, RandomRouter
from proxray.routing.routers import KMeansRouter, KNNRouter

ROUTERS = {"km": KMeansRouter, "knn": KNNRouter}  # the ProxRouters, by the short names the CLI takes
NAMES = {"km": "KMeans", "knn": "kNN"}
CLASSES = {c.__name__: c for c in (KNNRouter, KMeansRouter, MLPRouter, RandomRouter, LargestRouter)}


def router_class(name: str):
    """The class a router name means: "km", "knn" or a class name."""
    if name in ROUTERS:
        return ROUTERS[name]
    if name in CLASSES:
        return CLASSES[name]
    raise ValueError(f"router={name!r}: allowed values are {', '.join([*ROUTERS, *CLASSES])}")


def make_router(kind: str, weighting: str = "prox", hp: dict | None = None, temperature="auto",
                n_train: int | None = None):
    """A KMeans ("km") or kNN ("knn") router from shared hyperparameters {n_clusters, k, random_state, recall_floor};
    K is capped at the training-set size when given. The defaults are the routers' own: ``proxray fit`` builds the
    same one."""
    hp = hp or {}
    if kind == "km":
        K = hp.get("n_clusters", 32) if n_train is None else min(hp.get("n_clusters", 32), n_train)
        return KMeansRouter(n_clusters=K, weighting=weighting, temperature=temperature,
                            random_state=hp.get("random_state", 42))
    if kind == "knn":
        return KNNRouter(k=hp.get("k", 100), weighting=weighting, temperature=temperature,
                         recall_floor=hp.get("recall_floor", 0.95))
    raise ValueError(f"router={kind!r}: allowed values are {', '.join(ROUTERS)}")


def check_fit_memory(n: int, m: int, kind: str, dim: int = 384) -> None:
    """Embeddings (encoded, stacked, prepared: three copies), values and, for kNN, an HNSW graph, estimated for
    ``n`` queries × ``m`` models at the widest shipped encoder's width, against the memory available: an error
    before the table is encoded when they would not fit."""
    from proxray.common.memory import check_memory

    need = n * (3 * dim * 4 + 4 * m * 8 + (dim * 4 + 32 * 2 * 4 * 2 if kind == "knn" else 0))
    check_memory(need, f"fitting a {kind} router on {n} queries × {m} models", "fit on a part of the table "
                 "(--models, or a sample of its queries) or on a machine with more memory")


def load_router(path, expected_class=None, encoder_id: str | None = None):
    """Any registered router from its artifact (``artifact.load_router``: checksums, shapes, encoder checked)."""
    return artifact.load_router(path, CLASSES, expected_class=expected_class, encoder_id=encoder_id)
