"""Conversations that keep their model: a routed request that names a conversation (``"proxray": {"conversation":
ID}`` or the header ``x-proxray-conversation``) stays on the model that answered the conversation's last turn unless
the new turn's estimate favours another by more than a margin — a smaller one to escalate to a more accurate model
(``escalate_margin``: a turn that needs more capability should get it) than to step down to a cheaper one
(``step_down_margin``: saving cost mid-conversation risks the answer's quality and its coherence with the turns
before). Margins are in the router's objective, acc − λ·cost (estimated accuracy at λ = 0).

Which model a conversation is on lives in one actor per app (``ConversationBook``, named, namespace ``proxray``)
that every ingress replica asks, so a conversation keeps its model whichever replica a turn reaches. The book is
bounded (``max_entries``, the least recently used dropped first) and forgets a conversation idle for ``ttl_s``.
"""
from __future__ import annotations

import time

import numpy as np
from pydantic import Field

from proxray.common.lru import LRU
from proxray.common.shared_actor import SharedActorClient, SharedStateDown, logger
from proxray.common.yamlconfig import StrictModel
from proxray.routing.objective import objective


class ConversationBook:
    """Conversation id → the model that answered its last turn, bounded and expiring (the app's shared actor)."""

    def __init__(self, max_entries: int = 100_000, ttl_s: float = 3600.0):
        self.entries = LRU(max_entries)  # id -> (model, last seen)
        self.configure(max_entries, ttl_s)

    def configure(self, max_entries: int, ttl_s: float) -> None:
        """The app's current settings (every replica says them when it first finds the book: a redeploy applies)."""
        self.ttl_s = ttl_s
        self.entries.resize(max_entries)

    def recall(self, cid: str, now: float | None = None) -> str | None:
        now = time.time() if now is None else now
        hit = self.entries.get(cid)
        if hit is None:
            return None
        if now - hit[1] > self.ttl_s:
            self.entries.pop(cid)
            return None
        return hit[0]

    def remember(self, cid: str, model: str, now: float | None = None) -> None:
        self.entries.put(cid, (model, time.time() if now is None else now))

    def stats(self) -> dict:
        return {"conversations": len(self.entries), "dropped": self.entries.dropped}


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


class ConversationClient(SharedActorClient):
    """The ingress side: the app's ``ConversationBook`` actor, created by the first replica that needs it."""

    actor_cls, prefix = ConversationBook, "proxray-conversations"

    def actor_args(self) -> tuple:
        return self.spec.max_entries, self.spec.ttl_s

    @staticmethod
    def entry(cid: str, tenant: str | None) -> str:
        """The book's key of a conversation: its id within its API key's own space (another key's same id is another
        conversation)."""
        return cid if tenant is None else f"{tenant}\x00{cid}"

    async def recall(self, cid: str, tenant: str | None = None) -> str | None:
        """The model of the conversation's last turn; None where the book does not answer (it fails open: the turn
        is routed as a first one)."""
        try:
            return await self.call("recall", self.entry(cid, tenant))
        except SharedStateDown as e:
            logger.warning("proxray: %s: %s; the turn is routed as a first one", self.name, e.why)
            return None

    def remember(self, cid: str, model: str, tenant: str | None = None) -> None:
        self.tell("remember", self.entry(cid, tenant), model)  # fire and forget: the answer does not wait for it
