"""A ProxRouter hyperparameter's spec (``Param``: its name, type, default, allowed values and help; scikit-learn's
``_parameter_constraints``), the ones every family shares, and the checks against a family's spec. Each family states
its own (``PARAMS`` on its class, ``routing.knn`` / ``routing.kmeans``): its constructor takes its defaults from there
and validates against it once, in ``fit``; ``make_router``, the command line's options (``proxray fit`` / ``eval``),
``check_fit`` (run before a table is encoded) and the configuration reference are derived from it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from proxray.routing.index import METRICS

WEIGHTINGS = ("base", "prox")


@dataclass(frozen=True)
class Param:
    """One hyperparameter. ``low``/``high`` bound a number (``high="n"``: the training queries' number);
    ``choices`` list a string's values; ``none`` allows None (tuned or derived at fit time); ``cli`` is the command
    line's option for it, where it has one."""
    name: str
    type: type
    default: Any
    help: str
    low: float | None = None
    high: float | str | None = None
    choices: tuple | None = None
    none: bool = False
    cli: str | None = None

    def allowed(self) -> str:
        """What the parameter allows, in words (errors and the reference say it)."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        kind = "an integer" if self.type is int else "a number" if self.type is float else self.type.__name__
        lo = "" if self.low is None else f"{self.low:g}"
        hi = "" if self.high is None else "the training queries' number" if self.high == "n" else f"{self.high:g}"
        span = f" from {lo} to {hi}" if lo and hi else f" >= {lo}" if lo else f" <= {hi}" if hi else ""
        return kind + span + (", or None" if self.none else "")

    def problem(self, value, n: int | None = None, spelled: str | None = None) -> str | None:
        """Why ``value`` is not allowed (None when it is): the setting as the caller spells it, the value, the rule."""
        if value is None and self.none:
            return None
        prefix = spelled if spelled is not None else self.name + "="
        say = f"{prefix}{value!r}"
        if self.choices:
            return None if value in self.choices else f"{say}: allowed values are {', '.join(self.choices)}"
        numeric = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
        high = n if self.high == "n" else self.high
        if numeric and (self.type is not int or float(value).is_integer()) and \
                (self.low is None or value >= self.low) and (high is None or value <= high):
            return None
        rule = self.allowed() + (f" ({n})" if self.high == "n" and n is not None else "")
        fix = f"; pass {prefix}{min(max(n, 1), self.default)}" if self.high == "n" and n is not None else ""
        return f"{say}: must be {rule}{fix}"


WEIGHTING = Param("weighting", str, "prox", "prox: proximity-weighted (robust on unfamiliar queries); base: the "
                  "classic router", choices=WEIGHTINGS, cli="--weighting")
METRIC = Param("metric", str, "cosine", "the distance between embeddings", choices=METRICS)
TEMPERATURE = Param("temperature", object, "auto", "Prox's temperature (proxray.routing.temperature): auto, the "
                    "router's shipped one; a number, a fixed 1/tau; or a spec such as spread:0.2", cli="--temperature")


def defaults(cls) -> dict:
    """Every hyperparameter of router family ``cls`` (its class: ``routing.registry.family`` finds it by its short
    name) at its default."""
    return {name: p.default for name, p in cls.PARAMS.items()}


def problems(cls, params: dict, n: int | None = None, spelled: dict | None = None) -> list[str]:
    """Every problem of ``params`` against family ``cls``'s spec (temperature aside: ``parse_temperature`` checks it),
    at once; ``n``: the training queries' number; ``spelled``: how the caller spells a setting (``{"k": "--k "}``)."""
    spec, spelled = cls.PARAMS, spelled or {}
    out = [f"{name}: not a parameter of {cls.kind} routers (allowed: {', '.join(spec)})" for name in params
           if name not in spec]
    for name, value in params.items():
        if name in spec and name != "temperature":
            found = spec[name].problem(value, n, spelled.get(name))
            if found:
                out.append(found)
    return out


def check_params(cls, params: dict, n: int | None = None, spelled: dict | None = None) -> None:
    found = problems(cls, params, n, spelled)
    if found:
        raise ValueError("; ".join(found))


def check_fit(cls, params: dict, n_queries: int, n_models: int, dim: int = 384,
              spelled: dict | None = None) -> None:
    """Before a table is encoded: the hyperparameters against ``n_queries`` (k, n_clusters) and the fit's memory
    (embeddings in three copies, the values and what the family keeps besides, ``fit_bytes_per_query``) against the
    memory available."""
    from proxray.common.memory import check_memory

    check_params(cls, params, n_queries, spelled)
    need = n_queries * (3 * dim * 4 + 4 * n_models * 8 + cls.fit_bytes_per_query(dim))
    check_memory(need, f"fitting a {cls.kind} router on {n_queries} queries × {n_models} models", "fit on a part of "
                 "the table (--models, or a sample of its queries) or on a machine with more memory")
