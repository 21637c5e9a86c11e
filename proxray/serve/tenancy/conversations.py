"""Conversations that keep their model: a routed request that names a conversation (``"proxray": {"conversation":
ID}`` or the header ``x-proxray-conversation``) stays on the model that answered the conversation's last turn unless
the new turn's estimate favours another by more than a margin — a smaller one to escalate to a more accurate model
(``escalate_margin``: a turn that needs more capability should get it) than to step down to a cheaper one
(``step_down_margin``: saving cost mid-conversation risks the answer's quality and its coherence with the turns
before). Margins are in the router's objective, acc − λ·cost (estimated accuracy at λ = 0).

Which model a conversation is on lives in one actor per app (``ConversationBook``, named, namespace ``proxray``)
that every ingress replica asks, so a conversation keeps its model whichever replica a turn reaches. The book is
bounded (``max_entries``, the least recently used dropped first) and forgets a conversation idle for ``ttl_s``; one
key of the keys file holds at most ``key_share`` of it (past that, its own least recently used conversation is
dropped), so a key that opens conversations without end drops its own, not another key's.

That is the ``margin`` rule (``conversations.rule: margin``). The default, ``cache_aware``, prices what a switch gives
up instead: a coding agent's turns resend the whole growing conversation, and the model whose prompt cache holds it
bills that prefix at its cache-read price. The book keeps, per conversation and model, the prompt its last turn there
left in that model's cache and when (``cached``), and the conversation's mean output; each candidate's cost of the
turn is then what this turn is expected to be billed there (``proxray.serve.request.turn_cost``), and the conversation
switches only where another model's objective at its full price beats its own model's at its cached price
(``weigh_cache``).
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
from pydantic import Field

from proxray.common.lru import LRU
from proxray.common.pricing import Usage
from proxray.common.shared_actor import SharedActorClient, SharedStateDown, logger
from proxray.common.yamlconfig import StrictModel
from proxray.routing.objective import objective


class ConversationBook:
    """Conversation id → its model, what each model's prompt cache holds of it and its mean output, bounded and
    expiring (the app's shared actor)."""

    def __init__(self, max_entries: int = 100_000, ttl_s: float = 3600.0, key_share: float = 1.0):
        # id -> {"model", "at", "cached": {model: (prompt tokens, at)}, "out": [sum, n]}
        self.entries = LRU(max_entries, on_drop=self._forget)
        self.of_key: dict = {}  # a key's name -> its conversations' ids, least recently remembered first
        self.configure(max_entries, ttl_s, key_share)

    def configure(self, max_entries: int, ttl_s: float, key_share: float = 1.0) -> None:
        """The app's current settings (every replica says them when it first finds the book: a redeploy applies)."""
        self.ttl_s, self.share = ttl_s, max(1, int(max_entries * key_share))
        self.entries.resize(max_entries)

    @staticmethod
    def _key_of(cid: str) -> str | None:
        return cid.split("\x00", 1)[0] if "\x00" in cid else None  # ``ConversationClient.entry``'s

    def _forget(self, cid: str) -> None:
        key = self._key_of(cid)
        if key is not None and key in self.of_key:
            self.of_key[key].pop(cid, None)
            if not self.of_key[key]:
                del self.of_key[key]

    def _live(self, cid: str, now: float) -> dict | None:
        hit = self.entries.get(cid)
        if hit is None:
            return None
        if now - hit["at"] > self.ttl_s:
            self.entries.pop(cid)
            self._forget(cid)
            return None
        return hit

    def recall(self, cid: str, now: float | None = None) -> str | None:
        """The model of the conversation's last turn, or None."""
        hit = self._live(cid, time.time() if now is None else now)
        return hit["model"] if hit else None

    def session(self, cid: str, now: float | None = None) -> dict | None:
        """What the book holds of a conversation: ``model`` (its last turn's), ``cached`` (model → [prompt tokens,
        time] of its last turn there) and ``output_tokens`` (its turns' mean output, None before one is told); None
        for a conversation it does not know."""
        hit = self._live(cid, time.time() if now is None else now)
        if hit is None:
            return None
        total, n = hit["out"]
        return {"model": hit["model"], "cached": {m: list(v) for m, v in hit["cached"].items()},
                "output_tokens": total / n if n else None}

    def remember(self, cid: str, model: str, prompt_tokens: int | None = None, now: float | None = None) -> None:
        """The conversation's turn answered by ``model`` from a prompt of ``prompt_tokens`` (what that model's cache
        is expected to hold of it from now)."""
        now = time.time() if now is None else now
        entry = self.entries.get(cid) or {"cached": {}, "out": [0, 0]}
        entry.update(model=model, at=now)
        if prompt_tokens is not None:
            entry["cached"][model] = (int(prompt_tokens), now)
        key = self._key_of(cid)
        if key is not None:  # the key's share: past it, its own least recently remembered conversation goes
            mine = self.of_key.setdefault(key, {})
            mine.pop(cid, None)
            mine[cid] = None
            while len(mine) > self.share:
                oldest = next(iter(mine))
                del mine[oldest]
                self.entries.pop(oldest)
        self.entries.put(cid, entry)

    def told(self, cid: str, output_tokens: int) -> None:
        """A turn's answer's output tokens, once its usage is known."""
        entry = self.entries.get(cid)
        if entry is not None and output_tokens:
            entry["out"][0] += int(output_tokens)
            entry["out"][1] += 1

    def stats(self) -> dict:
        return {"conversations": len(self.entries), "dropped": self.entries.dropped,
                "keys": {k: len(v) for k, v in self.of_key.items()}}


def keep(candidates: list, previous: str | None, acc, cost, lam: float, models: list, spec: ConversationSpec,
         tool_loop: bool = False) -> dict:
    """Put the conversation's model first in ``candidates`` (the plan's order, changed in place) unless the router's
    choice beats it by more than the margin that applies — or whatever the margin, in a ``tool_loop`` (the turn returns
    the results of tools that model asked for); returns what the conversation did: ``new`` (no model yet, or its model
    is not a candidate of this request), ``kept`` or ``switched``, with the gain and the margin."""
    if previous is None or previous not in candidates:
        return {"action": "new", "previous": previous}
    if tool_loop:
        candidates.remove(previous)
        candidates.insert(0, previous)
        return {"action": "kept", "previous": previous, "tool_loop": True}
    best = candidates[0]
    if best == previous:
        return {"action": "kept", "previous": previous, "gain": 0.0}
    i, j = models.index(best), models.index(previous)
    obj = objective(np.asarray(acc)[None, :], np.asarray(cost)[None, :], np.array([float(lam)]))[0]
    gain = float(obj[i] - obj[j])
    margin = spec.escalate_margin if acc[i] > acc[j] else spec.step_down_margin
    report = {"previous": previous, "gain": round(gain, 8), "margin": margin,
              "direction": "escalate" if acc[i] > acc[j] else "step down"}
    if gain > margin:
        return {"action": "switched", **report}
    candidates.remove(previous)
    candidates.insert(0, previous)
    return {"action": "kept", **report}


def weigh_cache(candidates: list, previous: str | None, acc, costs, lam: float, models: list,
                tool_loop: bool = False) -> dict:
    """The ``cache_aware`` rule over a plan whose ``candidates`` were ordered at this turn's expected costs (``costs``:
    ``turn_cost.TurnCosts``): the conversation's model first unless another's objective at its expected cost beats the
    conversation's model's at its full price by more than what that model's cache saves (λ × the saving) — the same as
    beating it at its cached price, so the plan's order already says; changed in place. Returns what the
    conversation did (``new``, ``kept``, ``switched``), the switch's ``gain``, the ``cache_value`` it gives up and
    ``why``."""
    if previous is None or previous not in candidates:
        return {"action": "new", "previous": previous, "cache": costs.report()}
    if tool_loop:
        candidates.remove(previous)
        candidates.insert(0, previous)
        return {"action": "kept", "previous": previous, "tool_loop": True, "cache": costs.report()}
    others = [m for m in candidates if m != previous]
    j = models.index(previous)
    cache_value = float(lam) * (costs.full[j] - costs.cost[j])
    report = {"previous": previous, "cache_value": round(cache_value, 8), "cache": costs.report()}
    if not others:
        return {"action": "kept", **report, "gain": 0.0, "why": "no other candidate"}
    i = models.index(others[0])
    gain = float(acc[i] - lam * costs.cost[i]) - float(acc[j] - lam * costs.full[j])
    report.update(gain=round(gain, 8), runner_up=others[0])
    if candidates[0] != previous:
        return {"action": "switched", **report,
                "why": f"{others[0]} gains {gain:.4g} over {previous}, more than its cache is worth ({cache_value:.4g})"}
    return {"action": "kept", **report,
            "why": f"{others[0]} would gain {gain:.4g}, no more than {previous}'s cache is worth ({cache_value:.4g})"}


def named(rp, previous_id: str | None, session: str | None):
    """Request parameters ``rp`` with the conversation a turn continues: a stored response's (its id names it in the
    report), else a Messages client's session where the request names none; ``rp`` itself where neither."""
    if previous_id is not None:
        return replace(rp, conversation=previous_id)
    if session and rp.conversation is None:
        return replace(rp, conversation=session)
    return rp


def billed(report: dict, usage) -> None:
    """A whole answer's ``report`` (in place), where its conversation was priced by its cache: the tokens its usage (in
    chat's words) says were read from cache."""
    cache = (report.get("conversation") or {}).get("cache")
    if isinstance(cache, dict):
        u = Usage.of_chat(usage)
        cache["billed_cached_tokens"] = u.cache_read if u else None


class ConversationClient(SharedActorClient):
    """The ingress side: the app's ``ConversationBook`` actor, created by the first replica that needs it."""

    actor_cls, prefix = ConversationBook, "proxray-conversations"

    def actor_args(self) -> tuple:
        return self.spec.max_entries, self.spec.ttl_s, self.spec.key_share

    @staticmethod
    def entry(cid: str, tenant: str | None) -> str:
        """The book's key of a conversation: its id within its API key's own space (another key's same id is another
        conversation)."""
        return cid if tenant is None else f"{tenant}\x00{cid}"

    async def look_up(self, previous: str | None, cid: str | None, tenant: str | None, timings: dict) -> tuple:
        """(the model of the conversation's last turn, what the book holds of it): ``previous`` where the request
        itself names it (a stored response's; the book is not asked), else the book's for conversation ``cid``
        (``timings["conversation_ms"]``: how long it took to answer); (None, None) without either."""
        if previous is not None or not cid:
            return previous, None
        t0 = time.perf_counter()
        session = await self.session(cid, tenant)
        timings["conversation_ms"] = 1e3 * (time.perf_counter() - t0)
        return (session["model"] if session else None), session

    async def session(self, cid: str, tenant: str | None = None) -> dict | None:
        """What the book holds of the conversation (``ConversationBook.session``); None where it does not know it or
        does not answer (it fails open: the turn is routed as a first one)."""
        try:
            return await self.call("session", self.entry(cid, tenant))
        except SharedStateDown as e:
            logger.warning("proxray: %s: %s; the turn is routed as a first one", self.name, e.why)
            return None

    def remember(self, cid: str, model: str, tenant: str | None = None, prompt_tokens: int | None = None) -> None:
        """The turn's model and its prompt (fire and forget: the answer does not wait for it)."""
        self.tell("remember", self.entry(cid, tenant), model, prompt_tokens)

    def carry_on(self, cid: str, model: str, tenant: str | None, facts=None):
        """The turn answered by ``model`` (``facts``: its ``TurnFacts``, whose prompt that model's cache now holds):
        remembered now, and what tells the book its output once its usage is known (a function of the answer's usage,
        in chat's words)."""
        self.remember(cid, model, tenant, facts.prompt_tokens if facts is not None else None)
        entry = self.entry(cid, tenant)

        def told(usage) -> None:
            u = Usage.of_chat(usage)
            if u is not None and u.output:
                self.tell("told", entry, u.output)

        return told
