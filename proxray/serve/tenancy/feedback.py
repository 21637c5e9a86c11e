"""Feedback on answers: ``POST /v1/feedback`` with an answer's ``id`` (the ``id`` of the chat completion,
completion or response this endpoint returned) and a ``score`` in [0, 1], optionally a ``comment``.

Every answer the endpoint gives is remembered for ``retention_s`` — its routing text, the model that answered, the
cost of the answer at that model's price and which key asked — in one actor per app (``AnswerBook``, named,
namespace ``proxray``) that every ingress replica writes to fire-and-forget, in batches of up to 50 ms
(``SharedActorClient.later``), so feedback may reach any replica (feedback on an id not found is asked again after
two batches' time, before its 404). The book is bounded (``max_answers``, the oldest dropped first). Feedback on an id the book does not hold (never given,
expired, or given to another key) is a 404; a bad body a 400 naming the field. Accepted feedback is counted per model
(``proxray_feedback``, ``proxray_feedback_score_sum``) and handed to the drift monitor, which takes the score as that
model's label for that query (``grader: feedback`` in the tables it writes) and grows the router with it.
"""
from __future__ import annotations

import asyncio
import math
import sys
import time
from collections import OrderedDict

from pydantic import Field, field_validator

from proxray.common.pricing import answer_cost
from proxray.common.shared_actor import Batched, SharedActorClient, SharedStateDown
from proxray.common.yamlconfig import StrictModel
from proxray.serve.errors import RequestError


class FeedbackRequest(StrictModel):
    """The body of ``POST /v1/feedback``."""

    id: str = Field(min_length=1, max_length=256, description="the answer's id, as the endpoint returned it")
    score: float = Field(ge=0, le=1, description="how good the answer was: 0 (wrong) … 1 (right)")
    comment: str | None = Field(None, max_length=2000, description="free text, kept with the feedback by the monitor")

    @field_validator("score")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number in [0, 1]")
        return v


RECORD_BYTES = 2**10  # what an answer's record costs beside its routing text


def record_bytes(record: dict) -> int:
    """What one remembered answer is counted as: its routing text as Python holds it (1, 2 or 4 bytes a character)
    and ``RECORD_BYTES``."""
    return sys.getsizeof(record.get("text") or "") + RECORD_BYTES


class AnswerBook(Batched):
    """(key, answer id) → what feedback on it needs (routing text, model, cost, key), bounded in count and bytes, each
    key to its share of both, and expiring (the app's shared actor). One key's traffic cannot evict another's answers,
    nor overwrite one: an upstream id that repeats is another entry under another key."""

    def __init__(self, max_answers: int = 20_000, retention_s: float = 86400.0, max_bytes: int = 256 * 2**20,
                 key_share: float = 0.5):
        self.answers: OrderedDict = OrderedDict()  # (key, id) -> (record, time given, bytes)
        self.by_key: dict = {}  # key -> OrderedDict of its answers' ids, oldest first
        self.key_used: dict = {}  # key -> bytes its answers hold
        self.bytes, self.dropped = 0, 0
        self.configure(max_answers, retention_s, max_bytes, key_share)

    def configure(self, max_answers: int, retention_s: float, max_bytes: int, key_share: float) -> None:
        """The app's current settings (every replica says them when it first finds the book: a redeploy applies)."""
        self.max_answers, self.retention_s, self.max_bytes = max_answers, retention_s, max_bytes
        self.key_answers, self.key_bytes = max(1, int(key_share * max_answers)), key_share * max_bytes
        for key in [k for k in self.by_key if k is not None]:
            mine = self.by_key[key]
            while key in self.by_key and (len(mine) > self.key_answers or self.key_used[key] > self.key_bytes):
                self._drop(next(iter(mine)))
        self._fit()

    def _fit(self) -> None:
        """Past the book's bounds, the oldest entries of the key furthest over its fair share go (the book's count and
        bytes over the keys holding entries, in whichever it uses more of) — never a key within its fair share: while
        the book is over, some key is over its fair share."""
        while len(self.answers) > self.max_answers or self.bytes > self.max_bytes:
            n = len(self.key_used)
            fair_bytes, fair_count = self.max_bytes / n, self.max_answers / n
            victim = max(self.key_used, key=lambda k: max(self.key_used[k] / fair_bytes,
                                                           len(self.by_key[k]) / fair_count))
            self._drop(next(iter(self.by_key[victim])))

    def remember(self, answer_id: str, record: dict, now: float | None = None) -> bool:
        """Keep an answer (False, nothing kept and nothing dropped, where it alone is larger than its key's share);
        past its share, a key's own oldest answers go (answers without a key of the keys file share the whole book),
        past the book's bounds those of the key furthest over its fair share (``_fit``)."""
        size, key = record_bytes(record), record.get("key")
        if size > (self.max_bytes if key is None else self.key_bytes):
            return False
        entry = (key, answer_id)
        if entry in self.answers:
            self._drop(entry)
        self.answers[entry] = (record, time.time() if now is None else now, size)
        mine = self.by_key.setdefault(key, OrderedDict())
        mine[entry] = None
        self.key_used[key] = self.key_used.get(key, 0) + size
        self.bytes += size
        while key is not None and (len(mine) > self.key_answers or self.key_used[key] > self.key_bytes):
            self._drop(next(iter(mine)))
        self._fit()
        return True

    def _drop(self, entry: tuple) -> None:
        record, _, size = self.answers.pop(entry)
        key = record.get("key")
        del self.by_key[key][entry]
        self.key_used[key] -= size
        if not self.by_key[key]:
            del self.by_key[key], self.key_used[key]
        self.bytes -= size
        self.dropped += 1

    def find(self, answer_id: str, key: str | None, now: float | None = None) -> dict | None:
        """The answer's record, or None where it is unknown, expired or was given to another key."""
        now = time.time() if now is None else now
        while self.answers:  # the oldest first: drop what expired
            oldest, (_, given, _) = next(iter(self.answers.items()))
            if now - given <= self.retention_s:
                break
            self._drop(oldest)
            self.dropped -= 1  # expired, not pushed out
        hit = self.answers.get((key, answer_id))
        return None if hit is None else hit[0]

    def stats(self) -> dict:
        return {"answers": len(self.answers), "dropped": self.dropped}

    def usage(self) -> dict:
        """Bytes held, in all and per key."""
        return {"bytes": self.bytes, "keys": dict(self.key_used)}


class FeedbackClient(SharedActorClient):
    """The ingress side: the app's ``AnswerBook`` actor (created by the first replica that needs it), the answers'
    recorder and the feedback route's work."""

    actor_cls, prefix = AnswerBook, "proxray-answers"

    def actor_args(self) -> tuple:
        return self.spec.max_answers, self.spec.retention_s, self.spec.max_bytes, self.spec.key_share

    def recorder(self, answer_id: str | None, text: str, model: str, key: str | None, price, estimate: float | None):
        """A function of the answer's ``usage`` that remembers the answer ``answer_id`` (fire and forget) with its cost
        at the model's price (the router's estimate where there is no price or no usage); None where feedback is off
        or the answer has no id."""
        if not self.spec.enabled or not isinstance(answer_id, str) or not answer_id:
            return None

        def remember(usage):
            cost, _ = answer_cost(price, usage, estimate)
            record = {"text": text, "model": model, "key": key, "cost": cost}
            self.later("remember", answer_id, record)  # fails open: an answer not remembered cannot be scored

        return remember

    def check_enabled(self) -> None:

        if not self.spec.enabled:
            raise RequestError(404, "feedback is off for this endpoint (feedback.enabled: false)", kind="not_found_error")

    async def take(self, fb: FeedbackRequest, key: str | None, metrics, monitor, trains: bool = True,
                   source: str | None = None) -> dict:
        """``POST /v1/feedback`` once its body is parsed: the answer found (404 otherwise), the score counted and — from
        a key that ``trains`` (``feedback: train``; the app's single key, or an app without keys) — handed to the
        monitor, named as from ``source`` (the key's name: the monitor spot-checks each key's feedback). Returns the
        answer to send."""

        try:
            record = await self.call("find", fb.id, key)
            if record is None:  # an answer given a moment ago may still be in a replica's batch (``later``)
                await asyncio.sleep(2 * self.batch_s)
                record = await self.call("find", fb.id, key)
        except SharedStateDown:
            raise RequestError(503, "feedback cannot be taken right now (the answer book is restarting); retry in a "
                               "few seconds", kind="service_unavailable", headers={"retry-after": "2"}) from None
        if record is None:
            raise RequestError(404, f"no answer {fb.id[:80]!r} within the last {self.spec.retention_s:.0f} s for this "
                               "key", "id", kind="not_found_error")
        metrics.feedback(record["model"], fb.score)
        learned = trains and monitor is not None and monitor.feedback(record["text"], record["model"], fb.score,
                                                                      record["cost"], fb.comment, source)
        return {"object": "feedback", "id": fb.id, "model": record["model"], "score": fb.score,
                "learned": bool(learned)}
