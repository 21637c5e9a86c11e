"""What one turn of a conversation is expected to cost at each model: the cost term of its routing decision once the
conversation has a turn behind it. No HTTP and no Ray.

A coding agent sends its whole growing conversation every turn; what that is billed depends on whether the model's
prompt cache still holds the prefix. For model m, with the turn's prompt counted once (``prompt_tokens``, a token per
``CHARS_PER_TOKEN`` characters of the body every candidate is sent, from its ``TokenBound``):

    cached_m   = the prompt of the conversation's last turn on m, where that turn is within m's cache lifetime
                 (``price.cache_ttl_s``, refreshed by each use) and at least its minimum cacheable prefix
                 (``price.cache_min_tokens``); never more than this prompt
    prefix     = the prompt of the conversation's last turn (on its own model), what a model reads from now on once
                 the conversation is on it
    cost_m     = max(cached_m, prefix) × cache-read price + the rest of the prompt × new price (the cache-write price
                 where the request asks m's provider to write its cache, else the input price)
                 + expected output × output price
                 + (max(cached_m, prefix) − cached_m) × (new price − read price) / horizon

The last term is the one-off cost of moving the conversation to a model whose cache does not hold it — its prefix
billed in full once instead of read — spread over the turns a switch is expected to last (``horizon``,
``conversations.switch_horizon_turns``; 1: the whole of it on the turn that switches). The expected output is the
conversation's mean output so far (capped at the request's limit). The router's table estimate stays the cost of a
conversation's first turn and of any turn where a candidate has no price."""
from __future__ import annotations

from dataclasses import dataclass

from proxray.common.pricing import TokenBound

CHARS_PER_TOKEN = 4  # as count_tokens estimates a request for a model that does not count it itself
DEFAULT_OUTPUT_TOKENS = 512  # a turn's expected output before the conversation has told one


@dataclass(frozen=True)
class TurnCosts:
    """Each model's expected cost of this turn (``cost``, USD, in the router's model order), the prompt tokens its
    cache is expected to hold (``cached``), and what they were computed from."""

    cost: list
    full: list  # each model's cost with nothing read from its cache
    cached: dict  # model -> tokens expected read from its cache
    prompt_tokens: int
    output_tokens: int

    def report(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "expected_cached_tokens": dict(self.cached)}


@dataclass(frozen=True)
class TurnFacts:
    """What the ingress tells the decision of one request's turn: its prompt tokens (from its body's length, measured
    once), its output limit, and which models' providers it asks to write their prompt cache (``writes``: model →
    bool)."""

    prompt_tokens: int
    limit: int | None = None
    writes: dict | None = None


def turn_facts(bound: TokenBound, native: set, models) -> TurnFacts:
    """The ``TurnFacts`` of a conversation's turn from the ``TokenBound`` of the body every candidate is sent: its
    prompt tokens, its output limit, and which of ``models`` it asks to write their provider's prompt cache (its
    ``cache_control`` marks reach only the models in ``native``, those that serve its protocol themselves)."""
    return TurnFacts(bound.chars // CHARS_PER_TOKEN, bound.limit or None,
                     {m: bound.writes_cache and m in native for m in models})


def expected_cached(prompt_tokens: int, last: tuple | None, price, now: float) -> int:
    """The prompt tokens ``price``'s model is expected to read from its cache: ``last`` — (prompt tokens, time) of the
    conversation's last turn there — if that turn is within the model's cache lifetime and long enough to be cached."""
    if last is None or price is None:
        return 0
    tokens, at = last
    if now - at > price.cache_ttl_s or tokens < price.cache_min_tokens:
        return 0
    return int(min(tokens, prompt_tokens))


def turn_costs(models: list, prices: dict, session: dict, prompt_tokens: int, limit: int | None, writes: dict,
               now: float, horizon: float = 1.0) -> TurnCosts | None:
    """The ``TurnCosts`` of one turn of a conversation whose book entry is ``session`` (``model``: its last turn's;
    ``cached``: model → (prompt tokens, time) of its last turn there; ``output_tokens``: its mean output) for ``models``
    at ``prices`` (model → ``PriceSpec``); ``writes``: model → whether the request asks that model's provider to write
    its cache (billed at the write price); ``limit``: the request's output limit. None where a model has no price
    (the table's estimates decide).

    A model whose cache does not hold the conversation's prefix (the last turn's prompt) pays, this turn, the prefix at
    its write or input price instead of its read price — once: the turns after read it. ``horizon`` spreads that
    one-off cost over the turns a switch is expected to last (1: all of it on this turn)."""
    if any(prices.get(m) is None for m in models):
        return None
    out = session.get("output_tokens") or DEFAULT_OUTPUT_TOKENS
    out = int(min(out, limit)) if limit else int(out)
    held = session.get("cached") or {}
    last = held.get(session.get("model"))
    prefix = int(min(last[0], prompt_tokens)) if last else 0  # what the conversation's own model holds of it
    cost, full, cached = [], [], {}
    for m in models:
        p = prices[m]
        hit = expected_cached(prompt_tokens, held.get(m), p, now)
        new_price = p.write_price() if (writes or {}).get(m) else p.input_per_mtok
        whole = max(hit, prefix)  # what m reads on the turns after this one, were the conversation on it

        def usd(read: int) -> float:
            steady = whole * p.read_price() + (prompt_tokens - whole) * new_price + out * p.output_per_mtok
            return (steady + (whole - read) * max(new_price - p.read_price(), 0.0) / max(horizon, 1.0)) / 1e6

        cost.append(usd(hit))
        full.append(usd(0))
        if hit:
            cached[m] = hit
    return TurnCosts(cost, full, cached, prompt_tokens, out)
