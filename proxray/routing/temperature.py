"""How sharply a router tilts its prior toward near reference elements: the temperature τ of

    w_i(x) ∝ p_i · exp(−φ_i(x) / τ)

One typed value says it, validated once (``parse_temperature``):

* ``Fixed(inv_tau)``: 1/τ as given (the paper's 20; ``0`` = the prior, ``inf`` = the nearest element only).
* ``Spread(c)``: per query, 1/τ(x) = c / std(φ(x)) — the distances in units of the query's own spread, so one
  constant carries across tables and encoders. kNN's ``auto`` (c = 0.2).
* ``PlugIn(c)``: per query, the 1/τ minimizing the paper's bias–variance bound, with its variance and Lipschitz
  terms read off the fitted clusters and c weighting the bias term (KMeans only). KMeans' ``auto`` (c = 0.125).

``"auto"`` resolves to the router's shipped temperature; neither needs cross-validation. Strings for command
lines and artifacts: ``"20"``, ``"inf"``, ``"fixed:20"``, ``"spread:0.2"``, ``"plug-in:0.125"``, ``"auto"``.
A temperature is any object with ``weights(phi, prior, router)`` and ``spec``: the study of other rules
(research/tau) plugs its own in the same way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from proxray.routing.weights import bias_variance_weights, proximity_weights, spread_scaled

SPREAD_C = 0.2  # kNN's auto: 1/tau(x) = 0.2 / std of the query's k distances (research/tau: the spread temperature)
PLUG_IN_C = 0.125  # KMeans' auto: the bias term's weight (research/tau: the plug-in temperature)
PAPER_INV_TAU = 20.0  # the paper's 1/tau


class Temperature:
    """What every temperature has: ``kind``, a number (``value``), ``spec`` (its string) and ``weights``."""

    kind = ""

    @property
    def value(self) -> float:
        raise NotImplementedError

    @property
    def spec(self) -> str:
        return f"{self.kind}:{_fmt(self.value)}"

    def weights(self, phi, prior, router) -> np.ndarray:
        """Weights (q, n) over the reference elements at distances ``phi`` (q, n) with ``prior``."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.spec


@dataclass(frozen=True)
class Fixed(Temperature):
    """1/τ as given, the same for every query."""

    inv_tau: float = PAPER_INV_TAU
    kind = "fixed"

    def __post_init__(self):
        object.__setattr__(self, "inv_tau", _number(self.inv_tau, "fixed", allow_inf=True,
                                                    meaning="1/tau (0 = the prior, inf = the nearest element only)"))

    @property
    def value(self) -> float:
        return self.inv_tau

    def weights(self, phi, prior, router) -> np.ndarray:
        return proximity_weights(phi, self.inv_tau, prior)


@dataclass(frozen=True)
class Spread(Temperature):
    """1/τ(x) = c / std(φ(x)) over the query's reference elements (``weights.spread_scaled``)."""

    c: float = SPREAD_C
    kind = "spread"

    def __post_init__(self):
        object.__setattr__(self, "c", _number(self.c, "spread", meaning="c in 1/tau(x) = c / std of the distances"))

    @property
    def value(self) -> float:
        return self.c

    def weights(self, phi, prior, router) -> np.ndarray:
        return proximity_weights(spread_scaled(phi), self.c, prior)


@dataclass(frozen=True)
class PlugIn(Temperature):
    """Per query, the 1/τ of ``weights.BV_GRID`` minimizing Σ w_i² var_i + c · L² · (Σ w_i φ_i)², read off the
    fitted clusters (``KMeansRouter.bias_variance_stats``)."""

    c: float = PLUG_IN_C
    kind = "plug-in"

    def __post_init__(self):
        object.__setattr__(self, "c", _number(self.c, "plug-in", meaning="the bias term's weight c"))

    @property
    def value(self) -> float:
        return self.c

    def weights(self, phi, prior, router) -> np.ndarray:
        return bias_variance_weights(phi, prior, *router.bias_variance_stats(), [self.c])[0][1]


KINDS = {t.kind: t for t in (Fixed, Spread, PlugIn)}
FORMS = "a number >= 0 or inf (fixed 1/tau), fixed:N, spread:C, plug-in:C (KMeans), or auto"


def auto(router) -> Temperature:
    """The temperature that ships for a router family (its class: ``auto_temperature``): kNN ``Spread(0.2)``, KMeans
    ``PlugIn(0.125)``."""
    return router.auto_temperature()


def parse_temperature(value, router=None) -> Temperature:
    """A ``Temperature`` from what a user may write: a ``Temperature``, a number (fixed 1/τ), or a string
    (``FORMS``). ``router`` (a family's class) resolves ``"auto"`` and refuses a temperature that does not apply to it
    (one of ``KINDS`` not among the family's ``temperatures``). Errors name the value and the allowed forms."""
    if isinstance(value, Temperature):
        got = value
    elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        got = Fixed(float(value))
    elif isinstance(value, str):
        got = _parse_string(value.strip(), router)
    else:
        raise ValueError(f"temperature={value!r}: expected {FORMS}")
    # one of proxray's kinds the family does not take (a temperature of another kind, plugged in by its user, is its
    # own rule)
    if router is not None and got.kind in KINDS and got.kind not in router.temperatures:
        raise ValueError(f"temperature={got.spec!r} does not apply to router={router.kind!r}: its temperatures are "
                         f"{', '.join(router.temperatures)} (or auto)")
    return got


def _parse_string(text: str, router) -> Temperature:
    if text == "auto":
        if router is None:
            raise ValueError("temperature='auto' needs the router family to resolve")
        return auto(router)
    kind, sep, number = text.partition(":")
    if kind == "bv":  # the plug-in temperature's earlier name
        import warnings

        kind = "plug-in"
        warnings.warn(f"temperature {text!r} is deprecated: say {'plug-in' + sep + number!r}", DeprecationWarning,
                      stacklevel=4)
    if kind in KINDS:
        if not sep:
            return KINDS[kind]()
        return KINDS[kind](_to_float(number, text))
    return Fixed(_to_float(text, text))


def _to_float(number: str, text: str) -> float:
    try:
        return float(number)
    except ValueError:
        raise ValueError(f"temperature={text!r}: expected {FORMS}") from None


def _number(v, kind: str, allow_inf: bool = False, meaning: str = "") -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"temperature {kind}: {v!r} is not a number ({meaning})") from None
    if not (f >= 0 and (allow_inf or math.isfinite(f))):
        raise ValueError(f"temperature {kind}:{v!r}: must be a {'number >= 0 or inf' if allow_inf else 'finite number >= 0'}"
                         f" ({meaning})")
    return f


def _fmt(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:g}"


def legacy(inv_tau=None, tau=None, temperature="fixed") -> Temperature | str:
    """The temperature an earlier spelling meant: ``inv_tau`` (or ``tau``) read as ``temperature`` said —
    "fixed" 1/τ, "spread" c, "bv" the plug-in's c. Used for old artifacts and the deprecated keyword arguments.
    "ess" (an adaptive bandwidth measured in the τ study, never a default) is refused with what to do instead."""
    if tau is not None:
        t = float(tau)
        if not t >= 0:
            raise ValueError(f"tau={tau!r}: must be >= 0 (0 = hard nearest, inf = plain prior average)")
        inv_tau = math.inf if t == 0 else 1.0 / t
    if isinstance(inv_tau, str) and inv_tau != "auto":
        inv_tau = _to_float(inv_tau, inv_tau)
    if inv_tau == "auto":
        return "auto"
    inv_tau = PAPER_INV_TAU if inv_tau is None else inv_tau
    name = temperature or "fixed"
    if name == "ess":
        raise ValueError("temperature 'ess' (the adaptive bandwidth of the τ study) is not part of proxray: re-fit "
                         "with temperature='auto' (or spread:C / plug-in:C), e.g. `proxray fit --temperature auto`; "
                         "research/tau keeps the study")
    kind = {"fixed": Fixed, "spread": Spread, "bv": PlugIn, "plug-in": PlugIn}.get(name)
    if kind is None:
        raise ValueError(f"temperature={name!r}: allowed values are fixed, spread, bv")
    return kind(inv_tau)


OLD_NAMES = ("fixed", "spread", "bv", "ess")  # the earlier --temperature values, read with --inv-tau


def from_options(temperature, inv_tau=None, router=None) -> tuple[Temperature, str | None]:
    """The temperature a command line asked for: ``--temperature SPEC``, or the deprecated ``--inv-tau N`` (with
    ``--temperature fixed|spread|bv`` naming how N was read). Returns (temperature, deprecation message or None);
    errors name the option and the allowed forms before any work starts."""
    if inv_tau is None:
        try:
            return parse_temperature("auto" if temperature is None else temperature, router), None
        except ValueError as e:
            raise ValueError(f"--temperature {temperature}: {e}") from None
    name = temperature if temperature in OLD_NAMES else "fixed"
    if temperature not in (None, "auto", *OLD_NAMES):
        raise ValueError(f"--inv-tau {inv_tau} with --temperature {temperature}: say one --temperature ({FORMS})")
    try:
        got = legacy(inv_tau, None, name)
        got = parse_temperature(got, router)
    except ValueError as e:
        raise ValueError(f"--inv-tau {inv_tau}: {e}") from None
    said = f"--inv-tau {inv_tau}" + (f" --temperature {temperature}" if temperature in OLD_NAMES else "")
    return got, f"{said} is deprecated: say --temperature {'auto' if inv_tau == 'auto' else got.spec}"
