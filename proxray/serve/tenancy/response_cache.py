"""The response cache's store: answers kept per **scope** (a key's own, or the tenant group its keys-file entry names),
one actor per app (namespace ``proxray``) that every ingress replica asks.

An entry is one model's answer to one request — the objects the model sent (a whole answer, or a stream's events),
with its usage zeroed, since a hit is billed nothing — under the request's exact key, with the routing embedding of
its text, its text's ``text_key`` and its **constraint** (the protocol, whole or streamed, the model that answered, and
every field of the request but the last user message's text). A lookup finds the exact key in the scope; else an
entry of the same constraint and the same ``text_key``; else, where a threshold is set, the entry of the same
constraint whose embedding is nearest, where its cosine similarity reaches the threshold. Nothing is
ever looked up outside the lookup's scope: two keys share entries only where the keys file puts both in one group.

Bounds (``ResponseCacheSpec``): entries live ``ttl_s``; the store holds ``max_entries`` and ``max_bytes`` at most, one
scope a ``scope_share`` of each: past its share a scope drops its own least recently used entries, never another's;
past the whole store's bounds the least recently used entry of all goes. Losing the actor loses the cache, not an
answer: a lookup that gets no answer is a miss that says why (logged), a write that gets none is dropped."""
from __future__ import annotations

import json
import time
from collections import OrderedDict

import numpy as np

from proxray.common.shared_actor import SharedActorClient

ENTRY_OVERHEAD = 1024  # bytes counted for an entry beside its JSON (its keys, vector and bookkeeping)


class CacheStore:
    """The app's cached answers (``get``, ``put``, ``forget``, ``report``); ``limits``: (ttl_s, max_entries,
    max_bytes, scope_share)."""

    def __init__(self, limits: tuple = (3600.0, 50_000, 256 * 2**20, 0.25)):
        self.limits = limits
        self.entries: OrderedDict = OrderedDict()  # (scope, exact key) -> entry, least recently used first
        self.by_scope: dict = {}  # scope -> {exact key: None}, insertion-ordered (its own LRU follows self.entries)
        self.sizes: dict = {}  # scope -> bytes held
        self.by_text: dict = {}  # (scope, constraint, text key) -> the exact key of the entry kept last under them
        self.total = 0
        self.stats = {"hits_exact": 0, "hits_semantic": 0, "misses": 0, "stored": 0, "evicted": 0, "expired": 0}

    # ---- lookups ------------------------------------------------------------------------------------------------
    def get(self, scope: str, exact: str | None, constraint: str | None = None, vector=None,
            threshold: float | None = None, text: str | None = None, now: float | None = None) -> dict | None:
        """The entry of ``scope`` under ``exact`` (None: no exact lookup); else one of the same ``constraint`` whose
        ``text`` (its routing text's ``text_key``) is the same; else, where ``threshold`` is set, the one whose embedding is nearest
        ``vector`` with cosine similarity ``threshold`` at least; None on a miss. ``{"kind": "exact" | "semantic",
        "match": "text" | "embedding", "similarity", "model", "objects", "head", "ids", "cost_usd"}``."""
        now = time.time() if now is None else now
        self._expire(now)
        entry = self._live(self.entries.get((scope, exact)) if exact else None, now)
        kind, match, similarity = "exact", None, 1.0
        if entry is None and constraint is not None:
            entry, match, similarity = self._semantic(scope, constraint, vector, threshold, text, now)
            kind = "semantic"
        if entry is None:
            self.stats["misses"] += 1
            return None
        self.entries.move_to_end((scope, entry["exact"]))
        self.by_scope[scope].pop(entry["exact"])
        self.by_scope[scope][entry["exact"]] = None
        entry["hits"] += 1
        self.stats[f"hits_{kind}"] += 1
        return {"kind": kind, "match": match, "similarity": round(float(similarity), 6), "model": entry["model"],
                "objects": entry["objects"], "head": entry["head"], "ids": entry["ids"], "cost_usd": entry["cost_usd"]}

    def _semantic(self, scope: str, constraint: str, vector, threshold: float | None, text: str | None, now: float):
        """(entry, how it matched, its embedding's similarity) of the semantic lookup, or (None, None, 0)."""
        if vector is not None:
            vector = np.asarray(vector, dtype=np.float32)
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
        same = self.entries.get((scope, self.by_text.get((scope, constraint, text), "")))
        if text is not None and same is not None and same["expires"] > now:  # one dictionary lookup
            sim = float(same["vector"] @ vector) if vector is not None and same["vector"] is not None else 1.0
            return same, "text", sim
        if threshold is None or vector is None:
            return None, None, 0.0
        with_vectors = [c for c in (self.entries[(scope, e)] for e in self.by_scope.get(scope, ()))
                        if c["constraint"] == constraint and c["vector"] is not None and c["expires"] > now]
        if not with_vectors:
            return None, None, 0.0
        sims = np.stack([c["vector"] for c in with_vectors]) @ vector
        best = int(np.argmax(sims))
        return (with_vectors[best], "embedding", float(sims[best])) if sims[best] >= threshold else (None, None, 0.0)

    # ---- writes -------------------------------------------------------------------------------------------------
    def put(self, scope: str, exact: str, record: dict, now: float | None = None) -> bool:
        """Keep ``record`` (``model``, ``objects`` — the answer's JSON —, ``head``, ``ids``, ``cost_usd``,
        ``constraint``, ``vector``, ``answer_id``) under ``exact`` in ``scope``: False where it alone is past the
        scope's share of bytes (kept nowhere)."""
        now = time.time() if now is None else now
        ttl_s, max_entries, max_bytes, share = self.limits
        size = len(record["objects"]) + ENTRY_OVERHEAD
        if size > share * max_bytes:
            return False
        self._drop(scope, exact)
        vector = record.get("vector")
        if vector is not None:
            vector = np.asarray(vector, dtype=np.float32)
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
        self._expire(now)
        self.entries[(scope, exact)] = {**record, "vector": vector, "scope": scope, "exact": exact, "size": size, "hits": 0,
                                        "expires": now + ttl_s}
        self.by_scope.setdefault(scope, {})[exact] = None
        if record.get("text") is not None and record.get("constraint") is not None:
            self.by_text[(scope, record["constraint"], record["text"])] = exact
        self.sizes[scope] = self.sizes.get(scope, 0) + size
        self.total += size
        self.stats["stored"] += 1
        own = self.by_scope[scope]
        while len(own) > max(1, int(share * max_entries)) or self.sizes[scope] > share * max_bytes:
            self._drop(scope, next(iter(own)), evicted=True)  # the scope's own least recently used
        while len(self.entries) > max_entries or self.total > max_bytes:
            self._drop(*next(iter(self.entries)), evicted=True)  # the store's least recently used
        return True

    def forget(self, scope: str, answer_id: str) -> int:
        """Drop ``scope``'s entries whose answer was ``answer_id`` (a stored response deleted): how many."""
        gone = [e for e in list(self.by_scope.get(scope, ())) if self.entries[(scope, e)].get("answer_id") == answer_id]
        for e in gone:
            self._drop(scope, e)
        return len(gone)

    def _drop(self, scope: str, exact: str, evicted: bool = False) -> None:
        entry = self.entries.pop((scope, exact), None)
        if entry is None:
            return
        own = self.by_scope[scope]
        own.pop(exact, None)
        texts = (scope, entry.get("constraint"), entry.get("text"))
        if self.by_text.get(texts) == exact:
            del self.by_text[texts]
        self.sizes[scope] -= entry["size"]
        self.total -= entry["size"]
        if not own:
            del self.by_scope[scope], self.sizes[scope]
        if evicted:
            self.stats["evicted"] += 1

    def _expire(self, now: float) -> None:
        """Drop expired entries among the 64 least recently used (each call: bounded work); an expired entry found
        by a lookup is dropped there (``_live``)."""
        for key in [k for k, _ in zip(self.entries, range(64)) if self.entries[k]["expires"] <= now]:
            self._drop(*key)
            self.stats["expired"] += 1

    def _live(self, entry, now: float):
        if entry is not None and entry["expires"] <= now:
            self._drop(entry["scope"], entry["exact"])
            self.stats["expired"] += 1
            return None
        return entry

    def report(self) -> dict:
        """Entries and bytes per scope (scopes by their first 12 characters), and the counts."""
        return {"entries": len(self.entries), "bytes": self.total, **self.stats,
                "scopes": {s[:12]: {"entries": len(v), "bytes": self.sizes[s]} for s, v in self.by_scope.items()}}


class ResponseCache(SharedActorClient):
    """A replica's side of the app's ``CacheStore`` (``proxray-cache-<app>``): a lookup that gets no answer raises
    ``SharedStateDown`` (the ``Lookup`` stage logs it and answers it as a miss that says why), a write that gets none
    is dropped (logged); the request goes on to its model either way."""

    actor_cls, prefix = CacheStore, "proxray-cache"

    def actor_args(self) -> tuple:
        s = self.spec
        return ((s.ttl_s, s.max_entries, s.max_bytes, s.scope_share),)

    async def get(self, scope: str, exact: str | None, constraint: str | None, vector, threshold: float | None,
                  text: str | None = None) -> dict | None:
        return await self.call("get", scope, exact, constraint,
                               None if vector is None else np.asarray(vector, dtype=np.float32), threshold, text)

    def put(self, scope: str, exact: str, record: dict) -> None:
        self.tell("put", scope, exact, record)

    def forget(self, scope: str, answer_id: str) -> None:
        self.tell("forget", scope, answer_id)


def objects_json(objects: list) -> str:
    """An answer's objects as the store keeps them (``put``'s ``objects``)."""
    return json.dumps(objects, separators=(",", ":"), default=str)
