"""The translation core every protocol shares: ids, the one usage record and its mapping to and from each protocol's
words, the one output limit, the state machine that turns a chat chunk stream into another protocol's events (each
protocol writes its own events from what it is told), the model client of a protocol translated to chat for the
models that do not serve it, and the stream helpers (one object as a stream, a stream with ``cancel()``).

No HTTP and no Ray: dicts in, dicts out."""
from __future__ import annotations

from dataclasses import dataclass, field

from proxray.common.pricing import Usage  # noqa: F401 - the usage record every protocol reads and writes
from proxray.serve.errors import RequestError, error, is_error
from proxray.serve.wire import CHAT_PATH as CHAT_UPSTREAM  # the internal request: the chat form every model takes
from proxray.serve.wire import COUNTS, LIMIT_FIELDS
from proxray.serve.wire import new_id  # noqa: F401 - the ids every protocol makes


# ---- usage: the one record (``proxray.common.pricing.Usage``), read and written in each protocol's words there ------


# ---- the one output limit ----------------------------------------------------------------------------------------
MAX_LIMIT, MAX_COUNT = 1_000_000, 16


def whole_numbers(body: dict) -> list:
    """What a hold multiplies, whatever the protocol: every output limit field and answer count (``n``, ``best_of``)
    a body sends a whole number in its range, and at most one limit field — else a 400 naming the field(s). Returns
    the limit fields it sends."""
    for name in LIMIT_FIELDS + COUNTS:
        v = body.get(name)
        top = MAX_COUNT if name in COUNTS else MAX_LIMIT
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top):
            raise RequestError(400, f"{name}: a whole number from 1 to {top} (got {str(v)[:40]!r})", name)
    sent = [f for f in LIMIT_FIELDS if body.get(f) is not None]
    if len(sent) > 1:
        raise RequestError(400, f"{' and '.join(sent)}: give one output limit, not {len(sent)} (the model is sent "
                           "one, and what the request may cost is bounded by it)", sent[1])
    return sent


def output_limit(req) -> int | None:
    """The output limit a parsed request sends, whichever field its protocol names it by (``LIMIT_FIELDS``; its
    schema lets at most one through)."""
    for name in LIMIT_FIELDS:
        v = getattr(req, name, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def one_limit(body: dict, own: tuple, default: int | None = None) -> dict:
    """``body`` with at most one output limit, one of the protocol's ``own`` fields (the first is written, with
    ``default``, where it sends none): a body that sends more than one of the limit fields any protocol knows
    (``LIMIT_FIELDS``), or one its protocol does not have, is refused (400 naming them) — the model is sent one limit,
    and what the request may cost is bounded by that one; so is a limit or an answer count (``n``, ``best_of``) that
    is not a whole number in its range."""
    sent = whole_numbers(body)
    if sent and sent[0] not in own:
        raise RequestError(400, f"{sent[0]}: not a field of this API; its output limit is {own[0]}", sent[0])
    if not sent and default is not None:
        body = {**body, own[0]: default}
    return body


def as_sent(req, default_max_tokens: int | None = None) -> dict:
    """A request's body as its key's first hold bounds it, before any work on it (``KeyGate.admit_request``): the body
    as sent (its routing options aside), with its one output limit (the app's ``default_max_tokens`` where it sends
    none; two are a 400 here, as they would be once begun). Its turn's body, once begun, may be larger (a stored conversation's
    history): the hold follows it once the request is planned (``KeyGate.hold_plan``)."""
    body = req.model_dump(exclude={"proxray"}, exclude_unset=True, mode="json")
    sent = whole_numbers(body)  # a decoy second limit is the 400 it would be once begun, before any admission
    limits = [body.pop(f) for f in sent]
    body["max_tokens"] = limits[0] if limits else int(default_max_tokens or 0)
    return body


# ---- streams -----------------------------------------------------------------------------------------------------
class Stream:
    """An async generator's objects with ``cancel()`` (what the fallback and the relay call on a stream they leave),
    which also cancels the model's stream it reads."""

    def __init__(self, gen, inner):
        self.gen, self.inner, self.finished = gen, inner, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return await self.gen.__anext__()
        except StopAsyncIteration:
            self.finished = True
            raise

    def cancel(self) -> None:
        if not self.finished and hasattr(self.inner, "cancel"):
            self.inner.cancel()


async def single(obj):
    """A stream of the one object ``obj`` (an error a model answers with before it is called)."""
    yield obj


async def via_chat(inner, stream: bool, whole, events, on_error=None):
    """A chat answer (``inner``) as another protocol's: ``whole(obj)`` of a whole completion, or ``events``' objects of
    each chunk (``chunk(obj)``) and of the stream's end (``end()``); an error object as ``on_error`` says (default:
    as it is), which ends a stream."""
    on_error = on_error or (lambda obj: obj)
    if not stream:
        async for obj in inner:
            yield on_error(obj) if is_error(obj) else whole(obj)
        return
    async for obj in inner:
        if is_error(obj):
            yield on_error(obj)
            return
        for e in events.chunk(obj):
            yield e
    for e in events.end():
        yield e


class EventsFromChat:
    """The one state machine from a chat chunk stream to another protocol's event stream: it reads each chunk's
    reasoning, text and tool-call deltas, its finish reason (and vLLM's ``stop_reason``, the stop string matched) and
    its usage, and tells the protocol's ``writer`` in order — ``start()``, ``reasoning(text)``, ``text(text)``,
    ``tool(index, id, name, arguments)``, ``end(finish, matched, usage)`` — each returning that protocol's events."""

    def __init__(self, writer):
        self.writer, self.started = writer, False
        self.finish = self.matched = self.usage = None

    def _start(self) -> list:
        if self.started:
            return []
        self.started = True
        return self.writer.start()

    def chunk(self, obj: dict) -> list:
        """The events of one chat chunk."""
        out = self._start()
        if obj.get("usage"):
            self.usage = Usage.of_chat(obj["usage"])
        for c in obj.get("choices") or []:
            d = c.get("delta") or {}
            if thought := d.get("reasoning_content") or d.get("reasoning"):
                out += self.writer.reasoning(thought)
            if d.get("content"):
                out += self.writer.text(d["content"])
            for call in d.get("tool_calls") or []:
                fn = call.get("function") or {}
                out += self.writer.tool(call.get("index", 0), call.get("id"), fn.get("name"), fn.get("arguments") or "")
            if c.get("finish_reason"):
                self.finish, self.matched = c["finish_reason"], c.get("stop_reason")
        return out

    def end(self) -> list:
        """The closing events, once the chat stream ended."""
        return self._start() + self.writer.end(self.finish, self.matched, self.usage)


def completion_parts(obj: dict) -> tuple:
    """A whole chat completion's first choice as (its message, finish reason, the stop string matched, ``Usage``)."""
    choice = (obj.get("choices") or [{}])[0]
    return (choice.get("message") or {}, choice.get("finish_reason"), choice.get("stop_reason"),
            Usage.of_chat(obj.get("usage")))


def in_request_words(obj: dict, words: dict) -> dict:
    """A chat model's error object with its parameter named as the request names it (``words``: chat's name -> the
    request's), the error's other fields (a refusal's ``unsupported`` among them) kept."""
    e = dict(obj["error"])
    name = words.get(e.get("param"))
    if name and name != e.get("param"):
        e["message"] = f"{e.get('message', '')} (the request's {name})"
        e["param"] = name
    return {**obj, "error": e}


class ViaChat:
    """The model client (``stream``, ``refusals``) of one request of a protocol that the models in ``native`` serve
    themselves (relayed as it is, ``native_body(body)``) and every other model takes as chat completions (``chat``,
    translated once; ``problems``: ``{parameter: why}`` of what has no chat form, a 400 for those models). A chat answer
    comes back as ``whole(obj, model)``, or a stream through ``events(model)`` (an ``EventsFromChat``); ``words`` names
    a chat parameter as the request names it, in a translated model's error objects too (``on_error`` maps them after
    that, where given); ``on_native`` maps native objects; ``dropped``: what the translation left out."""

    def __init__(self, client, native: set, chat: dict, problems: dict, whole, events, words: dict,
                 on_error=None, native_body=None, on_native=None, dropped: list | None = None):
        self.client, self.native, self.chat, self.problems = client, native, chat, problems
        self.whole, self.events, self.words = whole, events, words
        named = lambda obj: in_request_words(obj, words)  # noqa: E731
        self.on_error = named if on_error is None else (lambda obj: on_error(named(obj)))
        self.native_body = native_body or (lambda body: body)
        self.on_native = on_native
        self.dropped = dropped or []  # what the translation left out, named in translated answers (``dropped_for``)

    def stream(self, model: str, upstream: str, body: dict, patient: bool = True):
        if model in self.native:
            inner = self.client.stream(model, upstream, self.native_body(body), patient)
            if self.on_native is None:
                return inner
            return Stream(_mapped(inner, self.on_native), inner)
        if self.problems:
            name = sorted(self.problems)[0]
            return Stream(single(error(400, f"model {model!r} answers through chat completions; "
                                          f"{self.problems[name]}", name)), None)
        inner = self.client.stream(model, CHAT_UPSTREAM, {**self.chat, "model": model}, patient)
        return Stream(via_chat(inner, body.get("stream"), lambda obj: self.whole(obj, model), self.events(model),
                               self.on_error), inner)

    async def refusals(self, models, body: dict, upstream: str) -> dict:
        """``{model: [parameters of the request it cannot honour]}``: a relayed model's from its capabilities, a
        translated one's those without a chat form and those its chat capabilities lack (in the request's words)."""
        out = await self.client.refusals([m for m in models if m in self.native], body, upstream)
        translated = await self.client.refusals([m for m in models if m not in self.native], self.chat, CHAT_UPSTREAM)
        for m, refused in translated.items():
            out[m] = sorted(set(self.problems) | {self.words.get(p, p) for p in refused})
        return out


def dropped_for(via: ViaChat, report: dict) -> dict:
    """``report`` with ``dropped`` (in place: the answer's headers are written from it) where the model that answered
    took the request translated and the translation left something out."""
    if report.get("model") not in via.native and via.dropped:
        report["dropped"] = via.dropped
    return report


async def _mapped(inner, fn):
    async for obj in inner:
        yield fn(obj)
