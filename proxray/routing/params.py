"""Every ProxRouter hyperparameter, stated once: its name, type, default, allowed values and help, per router family
(scikit-learn's ``_parameter_constraints``). The routers' constructors take their defaults from here and validate
against it once, in ``fit``; ``make_router``, the command line's options (``proxray fit`` / ``eval``), ``check_fit``
(run before a table is encoded) and the configuration reference are derived from it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from proxray.routing.index import INDEX_KINDS, MAX_REGRET, METRICS, RECALL_FLOOR, ROUTE_BUDGET_MS

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


def _p(*args, **kw) -> Param:
    return Param(*args, **kw)


WEIGHTING = _p("weighting", str, "prox", "prox: proximity-weighted (robust on unfamiliar queries); base: the "
               "classic router", choices=WEIGHTINGS, cli="--weighting")
METRIC = _p("metric", str, "cosine", "the distance between embeddings", choices=METRICS)
TEMPERATURE = _p("temperature", object, "auto", "Prox's temperature (proxray.routing.temperature): auto, the "
                 "router's shipped one; a number, a fixed 1/tau; or a spec such as spread:0.2", cli="--temperature")

SPECS: dict[str, dict[str, Param]] = {
    "knn": {p.name: p for p in (
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
           "recall_floor", low=1,
           none=True))},
    "km": {p.name: p for p in (
        _p("n_clusters", int, 32, "KMeans clusters", low=1, high="n", cli="--clusters"),
        WEIGHTING, TEMPERATURE, METRIC,
        _p("prior", str, "spread", "cluster prior: spread (n_i / s_i, the paper's), size (n_i) or uniform",
           choices=("spread", "size", "uniform")),
        _p("random_state", int, 42, "KMeans seed"),
        _p("n_init", int, 3, "KMeans restarts (the best kept)", low=1))},
}


def defaults(kind: str) -> dict:
    """Every hyperparameter of router family ``kind`` ("km" / "knn") at its default."""
    return {name: p.default for name, p in SPECS[kind].items()}


def problems(kind: str, params: dict, n: int | None = None, spelled: dict | None = None) -> list[str]:
    """Every problem of ``params`` against the spec (temperature aside: ``parse_temperature`` checks it), at once;
    ``n``: the training queries' number; ``spelled``: how the caller spells a setting (``{"k": "--k "}``)."""
    spec, spelled = SPECS[kind], spelled or {}
    out = [f"{name}: not a parameter of {kind} routers (allowed: {', '.join(spec)})" for name in params
           if name not in spec]
    for name, value in params.items():
        if name in spec and name != "temperature":
            found = spec[name].problem(value, n, spelled.get(name))
            if found:
                out.append(found)
    return out


def check_params(kind: str, params: dict, n: int | None = None, spelled: dict | None = None) -> None:
    found = problems(kind, params, n, spelled)
    if found:
        raise ValueError("; ".join(found))


def check_fit(kind: str, params: dict, n_queries: int, n_models: int, dim: int = 384,
              spelled: dict | None = None) -> None:
    """Before a table is encoded: the hyperparameters against ``n_queries`` (k, n_clusters) and the fit's memory
    (embeddings in three copies, the values and, for kNN, an HNSW graph) against the memory available."""
    from proxray.common.memory import check_memory

    check_params(kind, params, n_queries, spelled)
    graph = dim * 4 + defaults("knn")["hnsw_m"] * 2 * 4 * 2 if kind == "knn" else 0
    need = n_queries * (3 * dim * 4 + 4 * n_models * 8 + graph)
    check_memory(need, f"fitting a {kind} router on {n_queries} queries × {n_models} models", "fit on a part of the "
                 "table (--models, or a sample of its queries) or on a machine with more memory")
