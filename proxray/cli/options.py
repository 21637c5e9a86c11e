"""The command line's options for a router's settings: its hyperparameters (one option each, from the spec in
``proxray.routing.params``) and its temperature, read back from a parsed command line into the typed values the
library takes. Nothing under ``proxray.routing`` reads a command line."""
from __future__ import annotations

from proxray.routing.registry import DEFAULT_ROUTER, ROUTERS, SPECS, family
from proxray.routing.temperature import Temperature, from_options as temperature_from



def router_choices() -> list:
    """The router families by the registry's short names, as they are when a parser is built."""
    return sorted(ROUTERS)


def add_options(parser, names, kinds=None) -> None:
    """The command line's options for the hyperparameters ``names`` (each has one: ``cli``), their defaults and help
    from the spec of each family ``kinds`` (default: every registered one); a parameter the families share is added
    once, one of a family says which."""
    kinds = tuple(SPECS) if kinds is None else kinds
    seen = set()
    for name in names:
        for kind in kinds:
            p = SPECS[kind].get(name)
            if p is not None and p.cli not in seen:
                seen.add(p.cli)
                where = "" if all(p.name in SPECS[k] for k in kinds) else f"{kind}: "
                kw = {"choices": list(p.choices)} if p.choices else {"type": p.type}
                parser.add_argument(p.cli, default=p.default, dest=p.cli[2:].replace("-", "_"),
                                    help=f"{where}{p.help} (default {p.default})", **kw)


def hyperparameters(a, kind: str) -> dict:
    """The hyperparameters of family ``kind`` the command line's options (``add_options``) set."""
    return {p.name: getattr(a, p.cli[2:].replace("-", "_")) for p in SPECS[kind].values()
            if p.cli and p.name not in ("weighting", "temperature")}  # those two are make_router's own arguments


def spelled_by_cli(kind: str) -> dict:
    return {p.name: f"{p.cli} " for p in SPECS[kind].values() if p.cli}


# ---- the command line's temperature options ---------------------------------------------------------
TEMPERATURE_HELP = ("Prox's temperature: auto (default: kNN spread:0.2, 1/tau(x) = 0.2 / std of the query's k "
                    "distances; KMeans plug-in:0.125, per query the 1/tau minimizing the bias–variance bound over the "
                    "clusters; neither runs a CV), a number or fixed:N (a fixed 1/tau; inf = nearest only), spread:C, "
                    "plug-in:C (docs: the temperature)")


def add_temperature_options(p, default="auto") -> None:
    """``--temperature`` (and the deprecated ``--inv-tau``; ``--cv-rule`` / ``--cv-repeats`` now refused with where the
    CV rules went) on a subcommand's parser."""
    import argparse

    p.add_argument("--temperature", default=default, metavar="SPEC", help=TEMPERATURE_HELP)
    p.add_argument("--inv-tau", default=None, help=argparse.SUPPRESS)  # deprecated: --temperature
    p.add_argument("--cv-rule", default=None, help=argparse.SUPPRESS)  # the CV rules are research/tau's
    p.add_argument("--cv-repeats", default=None, help=argparse.SUPPRESS)


def temperature_option(a, router: str) -> Temperature:
    """The ``Temperature`` a parsed command line asked for of router family ``router`` (its short name;
    ``from_options``), a deprecation said once on stderr;
    ``--cv-rule`` / ``--cv-repeats`` are refused with where the cross-validated rules live now."""
    from proxray.common.logs import log

    for flag, v in (("--cv-rule", a.cv_rule), ("--cv-repeats", a.cv_repeats)):
        if v is not None:
            raise ValueError(f"{flag} {v}: the cross-validated temperature rules are not part of proxray (its auto "
                             "temperatures need no CV); the τ study keeps them: python research/tau/tau_selection.py")
    got, deprecation = temperature_from(a.temperature, a.inv_tau, family(router))
    if deprecation:
        log(deprecation)
    return got
