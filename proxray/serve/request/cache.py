"""What the response cache asks of one request (``proxray.serve.stages.cache``): whether it may be cached, its scope,
its exact key and its constraint, and an answer kept or replayed.

* **Cacheable** (``why_not``): no tools offered and no tool results returned, at most ``max_user_turns`` user turns,
  no conversation the gateway holds for the key (``previous_response_id``: its history is the key's own), and — with
  ``deterministic_only`` — temperature 0 or a seed; the request did not say ``proxray: {cache: false}``, and its key's
  ``cache`` entry allows the kind.
* **Exact key**: the protocol, whole or streamed, the model that answers it and the request as every candidate is sent
  it (the protocol's turn body: a stored conversation's history and a protocol's headers included), normalised — JSON
  key order and whitespace do not count, nor the fields that do not change the answer (``model``, ``user``,
  ``metadata``, ``store``, ``prompt_cache_key``, ``safety_identifier``, the gateway's own ``proxray``).
* **Constraint**: the same without the last user message's text — what a semantic hit must share exactly; the text
  itself is compared as written (``text_key``: case, runs of spaces and the punctuation that ends a sentence
  aside), else — where ``similarity`` is set — by its routing embedding. The model is the router's choice for this request: the request's
  named model, its key's allowed models and its λ all reach the cache through that choice.
* A kept answer's usage is zeroed (a hit is billed nothing, and its usage says so); a replayed one gets fresh ids."""
from __future__ import annotations

import hashlib
import json
import re

from proxray.serve.wire import new_id

SKIPPED = ("model", "user", "metadata", "store", "prompt_cache_key", "safety_identifier", "proxray")
TEXT_FIELDS = ("messages", "input")


def scope_of(key) -> str:
    """A key's scope: its tenant group's (``cache.group`` of its keys-file entry), else its own; the app's single key
    (or no auth) has one of its own."""
    if key is None:
        return "app"
    group = key.cache.group if key.cache is not None else None
    return f"group:{group}" if group else f"key:{key.owner}"


def kinds_for(key, spec) -> tuple[bool, bool]:
    """(exact, semantic): the kinds of lookup the app's ``spec`` and the key's ``cache`` entry allow."""
    own = key.cache if key is not None else None
    return (spec.exact and (own is None or own.exact), spec.semantic and (own is None or own.semantic))


def _user_turns(items) -> int:
    if isinstance(items, str):
        return 1
    return sum(1 for x in items or () if isinstance(x, dict) and x.get("role") == "user")


def why_not(body: dict, turn, spec, opted_out: bool) -> str | None:
    """Why a request may not be cached (None: it may)."""
    if opted_out:
        return "the request said cache: false"
    if body.get("tools") or body.get("functions") or turn.tool_loop:
        return "tools"
    if turn.grown:
        return "a stored conversation"
    turns = max(_user_turns(body.get(f)) for f in TEXT_FIELDS) if any(f in body for f in TEXT_FIELDS) else 1
    if turns > spec.max_user_turns:
        return f"{turns} user turns (max_user_turns {spec.max_user_turns})"
    if spec.deterministic_only and body.get("temperature", 1.0) != 0 and body.get("seed") is None:
        return "not deterministic (temperature 0 or a seed)"
    return None


def _digest(protocol: str, stream: bool, model: str, body: dict) -> str:
    kept = {k: v for k, v in body.items() if k not in SKIPPED}
    raw = json.dumps([protocol, bool(stream), model, kept], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


def _without_ask(body: dict) -> tuple[dict, list]:
    """The body without its last user message's text, and what was taken out (where, and what), from which the body
    is made again: two bodies differ in one of the two."""
    rest, ask = dict(body), []
    for field in TEXT_FIELDS:
        items = rest.get(field)
        if isinstance(items, str):
            rest[field], ask = "", [*ask, [field, items]]
        elif isinstance(items, list):
            last = max((i for i, x in enumerate(items) if isinstance(x, dict) and x.get("role") == "user"), default=None)
            if last is not None and "content" in items[last]:
                items = list(items)
                ask.append([field, last, items[last]["content"]])
                items[last] = {k: v for k, v in items[last].items() if k != "content"}
                rest[field] = items
    if isinstance(rest.get("prompt"), str):
        rest["prompt"], ask = "", [*ask, ["prompt", body["prompt"]]]
    return rest, ask


def keys_of(protocol: str, stream: bool, model: str, body: dict) -> tuple[str, str]:
    """(exact key, constraint) in one pass over the body: the constraint is the digest of the request without its last
    user message's text, the exact key that digest's with the text taken out."""
    rest, ask = _without_ask(body)
    constraint = _digest(protocol, stream, model, rest)
    raw = json.dumps(ask, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{constraint}:{raw}".encode()).hexdigest(), constraint


_SPACES = re.compile(r"[ \t\f\v]+")
_SENTENCE_MARK = re.compile(r"[.?!,;:]+(?=\s|$)")


def text_key(text: str) -> str:
    """The routing text as the semantic lookup matches it first: its lines in order, each in lower case, with runs of
    spaces made one (its indentation kept), the punctuation that ends a sentence or a clause (``.?!,;:`` before a
    space or the line's end) dropped, blank lines dropped — two asks that differ only there are the same ask. Nothing
    else is dropped: ``3.14`` keeps its point, ``f(1,2)`` its comma, a boolean expression its brackets."""
    lines = []
    for line in text.lower().splitlines():
        body = line.strip()
        if body:
            indent = line[:len(line) - len(line.lstrip())]
            lines.append(indent + _SPACES.sub(" ", _SENTENCE_MARK.sub("", body)).strip())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def zero_usage(obj):
    """``obj`` with every number under a ``usage`` field set to 0 (any protocol's shape, nested)."""
    if isinstance(obj, dict):
        return {k: (_zeroed(v) if k == "usage" else zero_usage(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [zero_usage(v) for v in obj]
    return obj


def _zeroed(v):
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return 0
    if isinstance(v, dict):
        return {k: _zeroed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_zeroed(x) for x in v]
    return v


def ids_of(obj: dict) -> list[str]:
    """The ids the model gave its answer (its own, a stream's message's or response's), to be replaced on a hit."""
    found = [obj.get("id"), *(obj.get(k, {}).get("id") for k in ("message", "response") if isinstance(obj.get(k), dict))]
    return sorted({i for i in found if isinstance(i, str) and len(i) >= 8})


def replayed(objects: str, ids: list[str]) -> list:
    """A kept answer's objects with fresh ids (the same prefix: ``chatcmpl-``, ``msg_``, ``resp_``)."""
    for old in ids:
        cut = max(old.find("-"), old.find("_"))
        fresh = new_id(old[:cut], old[cut]) if cut >= 0 else new_id("", "")
        objects = objects.replace(json.dumps(old), json.dumps(fresh))
    return json.loads(objects)


class Replay:
    """A kept stream's objects after its head, as a model's stream reads (``cancel`` included)."""

    def __init__(self, objects: list):
        self.objects = iter(objects)

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return next(self.objects)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self) -> None:
        self.objects = iter(())


class Recorder:
    """A model's stream read through, keeping what it sends (``seen``) and whether it ended (``complete``); anything
    else (``cancel``, ``done``) is the stream's own."""

    def __init__(self, inner):
        self.inner, self.seen, self.complete = inner, [], False

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            obj = await self.inner.__anext__()
        except StopAsyncIteration:
            self.complete = True
            raise
        self.seen.append(obj)
        return obj

    def __getattr__(self, name):
        return getattr(self.inner, name)
