"""The one registry of router classes: what the command line, the experiments, artifacts, serving and the monitor
name a router by ("km", "knn", or the class name) and how they make and load one."""
from __future__ import annotations

from proxray.routing import artifact
from proxray.routing.baselines import LargestRouter, MLPRouter, RandomRouter
from proxray.routing.kmeans import KMeansRouter
from proxray.routing.knn import KNNRouter
from proxray.routing.params import SPECS, defaults

ROUTERS = {"km": KMeansRouter, "knn": KNNRouter}  # the ProxRouters, by the short names the CLI takes
NAMES = {"km": "KMeans", "knn": "kNN"}  # as prose names them
LABELS = {"km": "KM", "knn": "kNN"}  # as the paper's tables and the reports' figures label them
assert set(ROUTERS) == set(SPECS), "every ProxRouter family has its hyperparameter spec (routing.params.SPECS)"
CLASSES = {c.__name__: c for c in (KNNRouter, KMeansRouter, MLPRouter, RandomRouter, LargestRouter)}


def router_class(name: str):
    """The class a router name means: "km", "knn" or a class name."""
    if name in ROUTERS:
        return ROUTERS[name]
    if name in CLASSES:
        return CLASSES[name]
    raise ValueError(f"router={name!r}: allowed values are {', '.join([*ROUTERS, *CLASSES])}")


def make_router(kind: str, weighting: str | None = None, hp: dict | None = None, temperature=None,
                n_train: int | None = None):
    """A KMeans ("km") or kNN ("knn") router: the family's defaults (``proxray.routing.params``, what ``proxray fit``
    builds) overridden by ``hp`` (its hyperparameters by name; those of the other family are ignored, so one ``hp``
    serves both) and by ``weighting`` / ``temperature`` when given. K is capped at ``n_train`` when given."""
    if kind not in ROUTERS:
        raise ValueError(f"router={kind!r}: allowed values are {', '.join(ROUTERS)}")
    params = {**defaults(kind), **{k: v for k, v in (hp or {}).items() if k in defaults(kind)}}
    if weighting is not None:
        params["weighting"] = weighting
    if temperature is not None:
        params["temperature"] = temperature
    if kind == "km" and n_train is not None:
        params["n_clusters"] = min(params["n_clusters"], n_train)
    return ROUTERS[kind](**params)


def load_router(path, expected_class=None, encoder_id: str | None = None):
    """Any registered router from its artifact (``artifact.load_router``: checksums, shapes, encoder checked)."""
    return artifact.load_router(path, CLASSES, expected_class=expected_class, encoder_id=encoder_id)
