"""Stored responses, shared by every ingress replica of an app: one named actor per app (``ResponseBook``, namespace
``proxray``), so ``GET /v1/responses/{id}``, ``DELETE`` and ``previous_response_id`` work whichever replica a request
reaches (vLLM keeps its own per engine, which a routed endpoint cannot use).

A response is kept as its JSON (the response object, the request's own input items, the response it continued) under
its API key: another key's id is unknown to a key, as for feedback. The book is bounded as the answer book is — in
count and in bytes, each key to its share — and it expires; continuing a conversation touches every response of it,
so a conversation in use is not the one that goes first. Storing is awaited before the answer (or a stream's last
event) reaches the client, so its next turn finds it; a book that does not answer is logged and the response is
answered unstored (it fails open), while reading one (retrieve, ``previous_response_id``) is a 503 naming it."""
from __future__ import annotations

import json
import time

from pydantic import Field

from proxray.common.shared_actor import SharedActorClient, SharedStateDown, logger
from proxray.common.yamlconfig import StrictModel
from proxray.serve.errors import RequestError
from proxray.serve.tenancy.feedback import AnswerBook


class ResponseBook(AnswerBook):
    """Response id → its record (``{"text": JSON, "key", "previous"}``), bounded per key and in all, expiring."""

    def _touch(self, entry: tuple, now: float) -> None:
        record, _, size = self.answers.pop(entry)
        self.answers[entry] = (record, now, size)
        self.by_key[record.get("key")].move_to_end(entry)

    def get(self, rid: str, key: str | None, now: float | None = None) -> str | None:
        record = self.find(rid, key, now)
        return None if record is None else record["text"]

    def chain(self, rid: str, key: str | None, now: float | None = None, max_items: int = 1000,
              max_bytes: int = 8 * 2**20) -> dict:
        """The conversation that ends with response ``rid``: ``{"records": [JSON, ...]}`` oldest first (each touched),
        ``{"missing": id}`` naming the first response of it that is not held (unknown, expired, deleted, another
        key's), or ``{"too_long": [items, bytes]}`` where it holds more than ``max_items`` responses or ``max_bytes``."""
        now = time.time() if now is None else now
        chain, at, seen, size = [], rid, set(), 0
        while at is not None and at not in seen:
            record = self.find(at, key, now)
            if record is None:
                return {"missing": at}
            seen.add(at)
            chain.append(at)
            size += len(record["text"])
            if len(chain) > max_items or size > max_bytes:
                return {"too_long": [len(chain), size]}
            at = record.get("previous")
        for at in reversed(chain):
            self._touch((key, at), now)
        return {"records": [self.answers[(key, at)][0]["text"] for at in reversed(chain)]}

    def delete(self, rid: str, key: str | None) -> bool:
        if self.find(rid, key) is None:
            return False
        self._drop((key, rid))
        self.dropped -= 1  # deleted, not pushed out
        return True


class ResponseStore(SharedActorClient):
    """The ingress side: the app's ``ResponseBook`` actor (created by the first replica that needs it)."""

    actor_cls, prefix = ResponseBook, "proxray-responses"

    def actor_args(self) -> tuple:
        return self.spec.max_responses, self.spec.retention_s, self.spec.max_bytes, self.spec.key_share

    def _down(self, e: SharedStateDown):
        return RequestError(503, "stored responses cannot be read right now (their book is restarting); retry in a "
                            "few seconds", kind="service_unavailable", headers={"retry-after": "2"})

    def _unknown(self, rid: str, param: str | None = None, why: str = ""):
        return RequestError(404, f"no stored response {rid[:80]!r} for this key{why} (responses are kept "
                            f"{self.spec.retention_s:.0f} s after their last use)", param, kind="not_found_error")

    async def put(self, rid: str, record: dict, previous: str | None, key: str | None) -> str | None:
        """Keep a response (its record as JSON): None where it is stored, else why not (logged where the book does
        not answer; a response larger than the key's share of the book is not stored, and nothing of the key's is
        dropped for it)."""
        try:
            kept = await self.call("remember", rid, {"text": json.dumps(record, separators=(",", ":")), "key": key,
                                                     "previous": previous})
        except SharedStateDown as e:
            logger.warning("proxray: %s: %s; response %s answered without being stored", self.name, e.why, rid)
            return "the response store did not answer"
        return None if kept else (f"the response is larger than this key's share of the store "
                                  f"({self.spec.key_share:g} of responses.max_bytes={self.spec.max_bytes})")

    async def get(self, rid: str, key: str | None) -> dict:
        """The stored record of ``rid`` (404 where this key has none)."""
        try:
            text = await self.call("get", rid, key)
        except SharedStateDown as e:
            raise self._down(e) from None
        if text is None:
            raise self._unknown(rid)
        return json.loads(text)

    async def conversation(self, rid: str, key: str | None) -> list:
        """The records of the conversation that ends with ``rid``, oldest first (404 naming ``previous_response_id``
        where one of them is not stored)."""
        if not self.spec.store:
            raise self._unknown(rid, "previous_response_id", " (this endpoint stores no responses: responses.store "
                                "is false)")
        try:
            got = await self.call("chain", rid, key, None, self.spec.max_history_items, self.spec.max_history_bytes)
        except SharedStateDown as e:
            raise self._down(e) from None
        if "too_long" in got:

            items, size = got["too_long"]
            raise RequestError(413 if items <= self.spec.max_history_items else 400,
                               f"the conversation previous_response_id continues holds more than "
                               f"{self.spec.max_history_items} responses or {self.spec.max_history_bytes} bytes "
                               f"(responses.max_history_items / max_history_bytes; {items} read, {size} bytes so far)"
                               ": start a new conversation with the turns that matter as input",
                               "previous_response_id")
        if "missing" in got:
            why = "" if got["missing"] == rid else f": the earlier response {got['missing'][:80]!r} it continues is " \
                "no longer stored"
            raise self._unknown(rid, "previous_response_id", why)
        return [json.loads(t) for t in got["records"]]

    async def delete(self, rid: str, key: str | None) -> None:
        try:
            found = await self.call("delete", rid, key)
        except SharedStateDown as e:
            raise self._down(e) from None
        if not found:
            raise self._unknown(rid)
