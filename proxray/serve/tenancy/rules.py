"""A key's rules over the pool, in one place (``KeyRules``): the models it may use (by name or routed) and may see (the
model listing, a report's evidence), its λ, the cheapest model it may use and what its requests meet past its budget,
whether its feedback trains the router, and the 403s. The request policy, the model listing, feedback and the evidence
all ask it; a new rule of a key goes here (its field in ``keys.KeySpec``). A spec of None — the app's single key, or
no auth — may do everything. Rate and budget are counted by the ledger (``keys``), admitted by the gate (``gate``)."""
from __future__ import annotations

from proxray.serve.config import ROUTER_MODEL
from proxray.serve.errors import RequestError
from proxray.serve.tenancy.keys import KeySpec


def narrow(within, requested) -> tuple | None:
    """The models ``requested`` (None: all) that ``within`` allows (None: no limit): None where neither limits, an
    empty tuple where none is left."""
    if within is None:
        return None if requested is None else tuple(requested)
    return tuple(m for m in (requested or within) if m in within)


class KeyRules:
    def __init__(self, prices: dict):
        self.prices = prices  # model -> PriceSpec, the priced models

    # ---- the models
    @staticmethod
    def may_use(spec: KeySpec | None, model: str) -> bool:
        return spec is None or spec.allowed_models is None or model in spec.allowed_models

    @staticmethod
    def visible(spec: KeySpec | None) -> tuple | None:
        """The models the key may see (None: all)."""
        return None if spec is None or spec.allowed_models is None else tuple(spec.allowed_models)

    @staticmethod
    def narrowed(spec: KeySpec | None, requested) -> tuple | None:
        """A request's ``proxray.allowed_models`` within its key's (None: any; an empty tuple: none left)."""
        return narrow(None if spec is None else spec.allowed_models, requested)

    @staticmethod
    def lam(spec: KeySpec | None) -> float | None:
        """The key's λ (None: the app's, or its budget's)."""
        return None if spec is None else spec.lam

    def check(self, spec: KeySpec | None, model: str, rp) -> None:
        """Before a request is planned: 403 for a model its key may not use, or a ``proxray.allowed_models`` that leaves
        none of the key's (``rp``: the request's ``RequestPolicy``, which narrowed it)."""
        if spec is None or spec.allowed_models is None:
            return
        if model != ROUTER_MODEL and not self.may_use(spec, model):
            raise RequestError(403, f"key {spec.name!r} may not use model {model!r} (it may use "
                               f"{', '.join(spec.allowed_models)})", "model", kind="permission_error")
        if not rp.allowed_models:
            raise RequestError(403, f"proxray.allowed_models: key {spec.name!r} may use none of them (it may use "
                               f"{', '.join(spec.allowed_models)})", "proxray.allowed_models", kind="permission_error")

    # ---- the budget
    def cheapest(self, spec: KeySpec | None, served) -> str | None:
        """The priced model the key may use whose million input and output tokens cost least (None: none priced)."""
        priced = [(p.input_per_mtok + p.output_per_mtok, m) for m in served
                  if self.may_use(spec, m) and (p := self.prices.get(m)) is not None]
        return min(priced)[1] if priced else None

    def past_budget(self, spec: KeySpec, routed: bool, model: str, served) -> bool:
        """What a request of a key over its ``cheapest`` budget meets: True — routed, it is planned again with cost
        deciding; False — it names the cheapest model the key may use (or none is priced) and goes as planned; a
        request naming any other model is refused (429 naming the cheapest)."""
        if routed:
            return True
        cheapest = self.cheapest(spec, served)
        if cheapest is not None and model != cheapest:
            raise RequestError(429, f"key {spec.name!r} is over its budget: it may use only the cheapest model it may "
                               f"use, {cheapest!r}", "model", kind="insufficient_quota")
        return False

    # ---- feedback
    @staticmethod
    def feedback(spec: KeySpec | None) -> tuple[bool, str | None]:
        """(whether the key's feedback trains the router, the source it is recorded under); 403 for a key that may
        not send feedback (``feedback: off``)."""
        if spec is None:
            return True, None
        if spec.feedback == "off":
            raise RequestError(403, f"key {spec.name!r} may not send feedback (feedback: off in the keys file)",
                               kind="permission_error")
        return spec.feedback == "train", spec.name
