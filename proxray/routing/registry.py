"""The one registry of router classes: what the command line, the experiments, artifacts, serving and the monitor
name a router by (a family's short name, or the class name) and how they make and load one."""
from __future__ import annotations

from proxray.routing import artifact
from proxray.routing.baselines import LargestRouter, MLPRouter, RandomRouter
from proxray.routing.kmeans import KMeansRouter
from proxray.routing.knn import KNNRouter
from proxray.routing.params import defaults

# The ProxRouter families, the first the default. A family is one class that describes itself (``ProxRouter``'s
# family attributes: short name, labels, hyperparameters, temperatures, evaluation protocol and outliers) and one
# entry here: everything else (the command line, fitting, evaluation, artifacts, serving, the reference) reads it.
FAMILIES = [KMeansRouter, KNNRouter]
ROUTERS = {c.kind: c for c in FAMILIES}  # by the short names the CLI takes
DEFAULT_ROUTER = FAMILIES[0].kind
NAMES = {c.kind: c.name for c in FAMILIES}  # as prose names them
LABELS = {c.kind: c.label for c in FAMILIES}  # as the paper's tables and the reports' figures label them
SPECS = {c.kind: c.PARAMS for c in FAMILIES}  # their hyperparameters (``routing.params.Param`` by name)
CLASSES = {c.__name__: c for c in (*FAMILIES, MLPRouter, RandomRouter, LargestRouter)}


def register(cls):
    """Add a ProxRouter family (a class that describes itself: ``ProxRouter``'s family attributes) to the registry,
    as ``FAMILIES``' entries are: the command line, fitting, evaluation and artifacts take it by its ``kind`` from
    then on. Returns the class (a decorator too). Its description is checked first; errors name what is missing."""
    from proxray.routing.prox import ProxRouter

    missing = [a for a in ("kind", "name", "label", "PARAMS", "default_outliers")
               if not isinstance(cls, type) or not issubclass(cls, ProxRouter) or not getattr(cls, a, None)]
    if missing:
        raise ValueError(f"router family {getattr(cls, '__name__', cls)!r}: a ProxRouter subclass whose family "
                         f"attributes are set; missing: {', '.join(missing)}")
    if cls.kind in ROUTERS and ROUTERS[cls.kind] is not cls:
        raise ValueError(f"router family {cls.__name__!r}: kind={cls.kind!r} is {ROUTERS[cls.kind].__name__}'s")
    cls.auto_temperature()  # the shipped temperature exists
    if cls not in FAMILIES:
        FAMILIES.append(cls)
    ROUTERS[cls.kind], NAMES[cls.kind], LABELS[cls.kind], SPECS[cls.kind] = cls, cls.name, cls.label, cls.PARAMS
    CLASSES[cls.__name__] = cls
    return cls


def family(kind: str):
    """The ProxRouter family ``kind`` names."""
    if kind not in ROUTERS:
        raise ValueError(f"router={kind!r}: allowed values are {', '.join(ROUTERS)}")
    return ROUTERS[kind]


def router_class(name: str):
    """The class a router name means: a family's short name or a class name."""
    if name in ROUTERS:
        return ROUTERS[name]
    if name in CLASSES:
        return CLASSES[name]
    raise ValueError(f"router={name!r}: allowed values are {', '.join([*ROUTERS, *CLASSES])}")


def make_router(kind: str, weighting: str | None = None, hp: dict | None = None, temperature=None,
                n_train: int | None = None):
    """A router of family ``kind``: the family's defaults (``PARAMS``, what ``proxray fit`` builds) overridden by
    ``hp`` (its hyperparameters by name; those of another family are ignored, so one ``hp`` serves all) and by
    ``weighting`` / ``temperature`` when given; fitted to ``n_train`` training queries when given
    (``for_training``: KMeans' clusters capped)."""
    cls = family(kind)
    params = {**defaults(cls), **{k: v for k, v in (hp or {}).items() if k in cls.PARAMS}}
    if weighting is not None:
        params["weighting"] = weighting
    if temperature is not None:
        params["temperature"] = temperature
    if n_train is not None:
        params = cls.for_training(params, n_train)
    return cls(**params)


def load_router(path, expected_class=None, encoder_id: str | None = None):
    """Any registered router from its artifact (``artifact.load_router``: checksums, shapes, encoder checked)."""
    return artifact.load_router(path, CLASSES, expected_class=expected_class, encoder_id=encoder_id)
