"""The endpoint's door for API keys: who is asking (``KeyGate.identify``), the key's rules applied (``rules.KeyRules``:
every rule of a key in one place), and what a request may cost it — its rate and budget admitted before any work on the
request, with a hold taken (``KeyGate.admit_request``), moved to its chosen model's once planned (``hold_plan``) and
settled exactly once by the answer's usage (``Held``). The keys file, the ring that reads it and the ledger actor that
counts spend are ``keys``."""
from __future__ import annotations

import hmac
import time

from proxray.common.pricing import TokenBound, Usage, answer_cost, as_missed
from proxray.serve.errors import RequestError
from proxray.serve.tenancy.keys import KeyRing, KeySpec
from proxray.serve.tenancy.leases import LeasedLedger
from proxray.serve.tenancy.ledger import LedgerClient
from proxray.serve.tenancy.rules import KeyRules


def refuse_unpriced(price, model: str, bound: TokenBound, why: str = "") -> None:
    """A 400 where a budgeted key's request asks ``model`` (at ``price``, or None) for a hosted tool (billed per call) or
    a spoken answer it has no price for: nothing would bound what it is billed."""
    if bound.audio and price is not None and price.audio_output_per_mtok is None:
        raise RequestError(400, f"modalities: an audio answer, and {why}model {model!r}, which has no price for audio "
                           "(price.audio_output_per_mtok in the app's config): a key with a budget may not ask for it",
                           "modalities")
    for i, kind in bound.hosted:
        if price is None or not price.tool_call_usd:
            raise RequestError(400, f"tools[{i}]: {kind!r} is a hosted tool the provider bills per call, and {why}"
                               f"model {model!r}, which has no price for its calls (price.tool_call_usd in the app's "
                               f"config): a key with a budget may not ask for it", f"tools[{i}]")


def past_rate(spec: KeySpec, retry_after_s: float) -> RequestError:
    """The 429 of a key past its ``requests_per_minute``, with its Retry-After."""
    return RequestError(429, f"key {spec.name!r}: {spec.requests_per_minute:g} requests a minute at most; "
                        f"retry after {retry_after_s:.1f} s", kind="rate_limit_error",
                        headers={"retry-after": str(max(1, int(retry_after_s + 0.999)))})


class RateDoor:
    """Before a request's body is read: a key the ledger refused for its rate on this replica is refused again at once
    until that answer's Retry-After has passed (a key sending past its rate costs no body read, parse or
    validation); the ledger decides every other request (``KeyGate.admit``)."""

    def __init__(self, requests):
        self.requests = requests  # the key requests counter
        self.until: dict = {}  # key name -> when its rate takes a request again, as the ledger last said

    def refused(self, spec: KeySpec, retry_after_s: float) -> RequestError:
        self.until[spec.name] = time.monotonic() + retry_after_s
        return past_rate(spec, retry_after_s)

    def check(self, spec: KeySpec | None) -> None:
        until = self.until.get(spec.name) if spec is not None else None
        if until is None:
            return
        left = until - time.monotonic()
        if left <= 0:
            del self.until[spec.name]
            return
        self.requests.inc(1, {"key": spec.name, "outcome": "rate"})
        raise past_rate(spec, left)


class KeyGate:
    """The endpoint's door: who is asking (the single key of ``api_key_file`` / ``api_key_env``, a key of the keys
    file, or nobody where no key is configured), and, for a key of the file, its rules (``rules``, the one
    ``KeyRules``), its rate and budget through the ledger, what the request holds and its answers' cost charged."""

    def __init__(self, keys_file: str | None, api_key: bytes, app_name: str, prices: dict, ledger_shards: int = 1,
                 slots: int = 64):
        from proxray.common.metric_defs import metric

        self.share = max(1, slots // 2)  # a key's requests in flight on this replica where its max_concurrent is unset

        self.ring = KeyRing(keys_file) if keys_file else None
        self.api_key, self.prices = api_key, prices
        self.rules = KeyRules(prices)  # every rule of a key: the request policy, listing, feedback, evidence ask it
        self.inflight: dict = {}  # key name -> its requests in flight on this replica (``enter``)
        self.ledger = LeasedLedger(LedgerClient(app_name, ledger_shards)) if keys_file else None  # on leases
        self.requests = metric("proxray_key_requests")
        self.door = RateDoor(self.requests)  # a key past its rate, refused before its body is read
        self.spend = metric("proxray_key_spend_usd")
        self.prompt_tokens = metric("proxray_key_prompt_tokens")

    def enter(self, spec: KeySpec | None) -> "Slot":
        """One of the key's ``max_concurrent`` slots on this replica (by default half the replica's), held until the
        answer ends (``Slot.release``): 429 at once where they are all taken."""
        if spec is None:
            return Slot(self, None)
        n, cap = self.inflight.get(spec.name, 0), spec.max_concurrent or self.share
        if n >= cap:
            self.requests.inc(1, {"key": spec.name, "outcome": "concurrent"})
            raise RequestError(429, f"key {spec.name!r}: {cap} requests in flight at once at most on this replica "
                               "(max_concurrent in the keys file; by default half the replica's slots)",
                               kind="rate_limit_error", headers={"retry-after": "1"})
        self.inflight[spec.name] = n + 1
        return Slot(self, spec.name)

    def identify(self, request) -> KeySpec | None:
        """The key of the request's bearer token, or of its ``x-api-key`` header (None: the single key, or no auth
        configured); 401 otherwise."""

        if not self.api_key and self.ring is None:
            return None
        header = request.headers.get("authorization", "")  # the openai SDKs' way, or the anthropic SDKs' x-api-key
        token = header[7:] if header.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        if self.api_key and hmac.compare_digest(token.encode(), self.api_key):
            return None
        spec = self.ring.identify(token) if self.ring is not None and token else None
        if spec is None:
            raise RequestError(401, "missing or invalid API key (Authorization: Bearer …, or x-api-key)",
                               kind="authentication_error")
        return spec

    def check_policy(self, spec: KeySpec | None, model: str, rp) -> None:
        """Before a request is planned: the key's 403s (``KeyRules.check``), counted."""
        try:
            self.rules.check(spec, model, rp)
        except RequestError:
            self.requests.inc(1, {"key": spec.name, "outcome": "forbidden"})
            raise

    async def admit(self, spec: KeySpec | None, hold_usd: float, ticket: str | None, budget: bool = True) -> dict | None:
        """The key's rate and budget, for a planned request that may cost up to ``hold_usd``: 429 past its rate or
        (``over_budget: reject``) its budget. Returns the key's report (name, spent, over budget; over budget with
        ``cheapest`` the caller routes down) or None; a key with neither limit is not asked about. ``budget=False``:
        the rate alone (feedback, which costs nothing, counts toward the key's rate)."""

        if spec is None:
            return None
        if not spec.requests_per_minute and not spec.budget:
            self.requests.inc(1, {"key": spec.name, "outcome": "ok"})
            return {"name": spec.name, "spent_usd": 0.0, "over_budget": False}
        verdict = await self.ledger.admit(spec, hold_usd, ticket if spec.budget else None)
        if not verdict["ok"]:
            self.requests.inc(1, {"key": spec.name, "outcome": "rate"})
            raise self.door.refused(spec, verdict["retry_after_s"])
        over = verdict["reason"] == "over_budget"
        if over and budget and spec.budget.over_budget == "reject":  # refused: the caller releases its hold (``Held``)
            raise self._over_budget(spec, verdict, "(what is held for requests in flight included), and this "
                                    f"request may cost up to {hold_usd:.6g} USD (its prompt, and max_tokens for each "
                                    "of its n answers, at the model's price)")
        self.requests.inc(1, {"key": spec.name, "outcome": "cheapest" if over else "ok"})
        return {"name": spec.name, "spent_usd": round(verdict["spent_usd"], 10), "over_budget": over}

    async def admit_request(self, spec: KeySpec | None, bound: TokenBound | None, take, reach: list, routed: bool,
                            served) -> tuple[dict | None, bool, float]:
        """The key's rate and budget before any work on the request — no history rebuilt, nothing embedded or planned,
        neither the served budget's λ nor the monitor told: a request past its key's rate or budget costs a parse. It
        holds an upper bound of its cost, its body as sent (``bound``: its ``TokenBound``, measured by the caller for a
        key with a budget only) at the dearest priced model of ``reach`` (the models it may reach), until it is planned
        (``hold_plan``) and its answer settles it (``Held``). Returns (the key's report or None, whether it is past a
        ``cheapest`` budget and routed: cost decides its plan, the USD held). ``take()``: the hold's ticket, taken once
        the body is known good."""
        if spec is None:
            return None, False, 0.0
        ticket = take()
        hold = max(self.holds(bound, [m for m in reach if m in self.prices]).values(), default=0.0) \
            if spec.budget else 0.0
        report = await self.admit(spec, hold, ticket)
        past = report["over_budget"] and self.rules.past_budget(spec, routed, reach[0] if reach else "", served)
        return report, past, hold

    async def hold_plan(self, spec: KeySpec, report: dict, plan, bound: TokenBound, ticket: str | None,
                        held_usd: float, estimate: float | None, served) -> tuple[float, bool]:
        """Once planned, the hold of a key with a budget moves to the chosen model's bound on the turn's whole body
        (``hold`` of its ``TokenBound``, ``bound``; ``estimate``: what that model's answer is estimated to cost, the
        router's for a named model with no price): lowered without a wait, or — where the turn outgrew what was
        admitted (a stored conversation's history, an unpriced model's estimate) — raised and the budget asked again
        (over a ``reject`` budget: 429). Returns (the USD held, whether the request is to be planned again: routed, and
        over a ``cheapest`` budget now)."""
        model = plan.candidates[0]
        refuse_unpriced(self.prices.get(model), model, bound)
        hold = self.hold(model, bound, estimate)
        if hold <= held_usd:
            if hold < held_usd:
                self.ledger.lower(spec, ticket, hold)
            return hold, False
        verdict = await self.ledger.rehold(spec, ticket, hold)
        if verdict["over_budget"] and not report["over_budget"]:
            report["over_budget"] = True
            if spec.budget.over_budget == "reject":
                raise self._over_budget(spec, verdict, f"(held included), and this request may cost up to "
                                        f"{hold:.6g} USD")
            return hold, self.rules.past_budget(spec, plan.report["routed"], model, served)
        return hold, False

    async def hold_fallback(self, spec: KeySpec | None, ticket: str | None, model: str, bound: TokenBound,
                            estimate: float | None, held_usd: float) -> float:
        """Before a fallback asks ``model`` (the candidate held for failed): the hold raised to ``model``'s bound where
        that is more than ``held_usd`` — over a ``reject`` budget a 429, ``model`` not asked — so a dearer fallback
        spends no more than was held for it. Returns the USD now held."""
        if spec is None or not spec.budget:
            return held_usd
        refuse_unpriced(self.prices.get(model), model, bound, "the model asked first failed, and the next is ")
        hold = self.hold(model, bound, estimate)
        if hold <= held_usd:
            return held_usd
        verdict = await self.ledger.rehold(spec, ticket, hold)
        if verdict["over_budget"] and spec.budget.over_budget == "reject":
            raise self._over_budget(spec, verdict, f"(held included); the model asked first failed, and the next, "
                                    f"{model!r}, may cost up to {hold:.6g} USD")
        return hold

    def _over_budget(self, spec: KeySpec, verdict: dict, what: str) -> RequestError:
        """The 429 of a request its key's ``reject`` budget refuses (counted): what the key spent of its budget, then
        ``what`` this request may cost."""
        self.requests.inc(1, {"key": spec.name, "outcome": "budget"})
        return RequestError(429, f"key {spec.name!r} spent {verdict['spent_usd']:.6g} USD of its {spec.budget.usd:g} "
                            f"USD budget per {spec.budget.window_s:g} s {what}", kind="insufficient_quota")

    def hold(self, model: str, bound: TokenBound, estimate: float | None) -> float:
        """An upper bound of what ``model``'s answer costs, from its request's ``bound`` (``TokenBound``): its prompt —
        the whole body, messages, tools, schemas, instructions and a Responses request's rebuilt history, a token for
        every 3 characters — and its whole output limit for each of its ``n`` (``best_of``) answers, at its price (the
        prompt at the cache-write price where the body asks for caching), and a hosted tool's ``max_uses`` calls at the
        dearest tool price. A model with no price has no upper bound: the router's estimate stands for it
        (docs/guides/budgets.md)."""
        if model not in self.prices:
            return float(estimate or 0.0)
        return self.holds(bound, [model])[model]

    def holds(self, bound: TokenBound, models: list) -> dict:
        """``hold`` of ``bound`` at each priced model of ``models``."""
        out = {}
        for m in models:
            price = self.prices[m]
            tool_usd = bound.tool_calls * max(price.tool_call_usd.values(), default=0.0)
            b = bound
            out[m] = float(price.bound(b.prompt, b.output, b.writes_cache, b.tier, b.audio)) + tool_usd
        return out

    def charger(self, spec: KeySpec | None, model: str, estimate: float | None, ticket: str | None = None,
                bound: TokenBound | None = None, shared_cache: bool = False):
        """A function of an answer's ``usage`` that settles the key's hold (``ticket``) to the answer's cost at the
        model's price. An answer that ends without usage — its client gone before the usage chunk, its model failed
        mid-stream, or no usage sent — is charged its hold (``hold``: what it was allowed to cost), never 0; the
        estimate stands where the model has no price. ``shared_cache``: the model's prompt cache is one every key of
        the gateway shares (a hosted provider's), so the answer is charged as if it had missed it (``as_missed``): a
        key's spend does not tell it what another key cached. None for the single key or no auth."""
        if spec is None:
            return None
        price = self.prices.get(model)
        bound = bound or TokenBound()
        held = self.hold(model, bound, estimate)

        def charge(usage):
            priced = as_missed(usage, bound.writes_cache) if shared_cache and isinstance(usage, dict) else usage
            usd = answer_cost(price, priced, held)[0] or 0.0
            u = Usage.of_chat(usage)
            tokens = (u.prompt, u.cache_read) if u is not None and u.prompt else None
            if usd > 0:
                self.spend.inc(float(usd), {"key": spec.name})
            if tokens:
                for cached, n in (("true", tokens[1]), ("false", tokens[0] - tokens[1])):
                    if n:
                        self.prompt_tokens.inc(n, {"key": spec.name, "cached": cached})
            if spec.budget or usd > 0:  # the ledger is asked about a key only where it charges (its tokens ride along)
                self.ledger.settle(spec.name, ticket if spec.budget else None, float(usd), tokens)

        return charge


class Slot:
    """A request's place among its key's ``max_concurrent`` on this replica, given back exactly once."""

    def __init__(self, gate: KeyGate, name: str | None):
        self.gate, self.name = gate, name

    def release(self, *_) -> None:
        if self.name is not None:
            self.gate.inflight[self.name] = max(self.gate.inflight.get(self.name, 1) - 1, 0)
            self.name = None


class Held:
    """One request's hold on its key's budget (``KeyGate.hold``), settled exactly once: released at 0 where no answer
    came (refused, failed, the client gone before it), else by the answer's charger — at its usage, or at its hold
    where it ended without usage."""

    def __init__(self, gate: KeyGate, spec: KeySpec | None):
        self.gate, self.spec, self.ticket, self.open = gate, spec, None, False

    def take(self) -> str | None:
        """The hold's ticket (None without a key)."""
        import uuid

        if self.spec is not None:
            self.ticket, self.open = uuid.uuid4().hex, True
        return self.ticket

    def release(self) -> None:
        if self.open:
            self.open = False
            if self.spec.budget:
                self.gate.ledger.settle(self.spec.name, self.ticket, 0.0)

    def refused(self, status: int, plan, bound: TokenBound | None, reached: bool = True) -> None:
        """The request ended in a refusal: nothing spent (the hold released) — but a 504 after a model had it
        (``reached``: a co-hosted model called, a relayed endpoint sent the request) may have been billed, so it is
        charged its hold at the model asked last, never 0. A 504 that never left the gateway is charged nothing."""
        if status == 504 and plan is not None and reached:
            last = (plan.report.get("failures") or [{}])[-1].get("model") or plan.candidates[0]
            charge = self.charger(last, plan.cost_of(last), bound)
            if charge is not None:
                charge(None)
        else:
            self.release()

    def charger(self, model: str, estimate: float | None, bound: TokenBound | None, shared_cache: bool = False):
        """The answer's charger (``KeyGate.charger``), which settles the hold from now on — once, whatever calls it."""
        charge = self.gate.charger(self.spec, model, estimate, self.ticket, bound, shared_cache) if self.open else None
        self.open = False
        if charge is None:
            return None
        done = []

        def once(usage):
            if not done:
                done.append(True)
                charge(usage)

        return once
