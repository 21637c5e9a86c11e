"""One ``POST /v1/responses`` through the gateway, and the models as the Responses API sees them.

``ResponsesModels`` calls a model that serves ``/v1/responses`` itself (an endpoint with ``responses_api: true``)
with the request as it is, and every other through chat completions (``translate``), so fallback, streaming, usage,
cost and budgets work the same for both. ``ResponsesTurn`` is what the ingress needs of one request: the body every
candidate gets (the conversation rebuilt from the stored responses ``previous_response_id`` continues, sent with
``store: false``: the gateway keeps responses, not the model), its routing text, the model that answered the
conversation's last turn, the response as the client sees it (the gateway's id, ``previous_response_id``, ``store``,
``metadata`` and the ``proxray`` report), stored before its last event or its body reaches the client."""
from __future__ import annotations

from proxray.serve.request.errors import RequestError, error, is_error
from proxray.serve.request.schemas import ROUTER_MODEL, text_of
from proxray.serve.request.sse import NamedEvents
from proxray.serve.responses.translate import (CHAT_TO_RESPONSES, TERMINAL, EventsFromChat, as_error, chat_usage,
                                               final_response, from_chat, in_responses_words, input_items, new_id,
                                               shell, to_chat)


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


async def _native(inner):
    async for obj in inner:
        yield as_error(obj)


async def via_chat(inner, stream: bool, whole, events, on_error=None):
    """A chat answer (``inner``) as another API's: ``whole(obj)`` of a whole completion, or ``events``' objects of
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


class ResponsesModels:
    """The model client (``stream``, ``refusals``) for one Responses request ``body``: relayed to the models in
    ``native``, translated to chat completions (once, here) for the rest."""

    def __init__(self, client, native: set, body: dict):
        self.client, self.native = client, native
        self.chat, self.problems = to_chat(body)

    def stream(self, model: str, endpoint: str, body: dict, patient: bool = True):
        if model in self.native:
            inner = self.client.stream(model, "responses", body, patient)
            return Stream(_native(inner), inner)
        if self.problems:
            name = sorted(self.problems)[0]
            return Stream(single(error(400, f"model {model!r} answers through chat completions; "
                                          f"{self.problems[name]}", name)), None)
        inner = self.client.stream(model, "chat", {**self.chat, "model": model}, patient)
        base = shell(body, "resp_pending", model, None, False)
        return Stream(via_chat(inner, body.get("stream"), lambda obj: from_chat(obj, base), EventsFromChat(base),
                               in_responses_words), inner)

    async def refusals(self, models, body: dict, endpoint: str) -> dict:
        """``{model: [parameters of the request it cannot honour]}``: a relayed model's from its capabilities, a
        translated one's those without a chat form and those its chat capabilities lack (in the request's words)."""
        out = await self.client.refusals([m for m in models if m in self.native], body, "responses")
        translated = await self.client.refusals([m for m in models if m not in self.native], self.chat, "chat")
        for m, refused in translated.items():
            out[m] = sorted(set(self.problems) | {CHAT_TO_RESPONSES.get(p, p) for p in refused})
        return out


async def single(obj):
    """A stream of the one object ``obj`` (an error a model answers with before it is called)."""
    yield obj


class ResponsesTurn:
    """One Responses request: built by ``begin`` once the conversation it continues (``records``, oldest first) is
    read from the store."""

    endpoint, param, hide_usage = "responses", "input", False
    session, tool_loop = None, False  # its conversation is previous_response_id's

    def __init__(self, req, records: list, default_max_tokens: int, client, native: set, store, keep: bool,
                 key: str | None):
        self.req, self.store, self.key = req, store, key
        self.rid = new_id("resp")
        self.keep = keep and req.store is not False  # the app stores responses and the request did not say no
        self.items = input_items(req.input)  # this request's own input items (input_items lists them)
        history = [replayable(x) for r in records for x in r["input"] + r["response"]["output"] if replayable(x)]
        self.previous = records[-1]["response"]["model"] if records else None  # the conversation's model
        self.previous_id = req.previous_response_id
        self.body = req.forward(default_max_tokens)
        self.body.update(input=history + self.items, store=False)
        self.client = ResponsesModels(client, native, self.body)  # the request as chat: translated once
        self.turns = [(m["role"], m["content"] if isinstance(m["content"], str) else
                       "\n".join(p.get("text") or "" for p in m["content"] or [] if p.get("type") == "text"))
                      for m in self.client.chat["messages"]]

    def text(self, policy: str) -> str:
        text = text_of(self.turns, policy)
        if self.req.model == ROUTER_MODEL and not text.strip():
            raise RequestError(400, "input: no text to route on (a user message with text, here or in the "
                               "conversation previous_response_id continues)", "input")
        return text

    def sse(self) -> NamedEvents:
        return NamedEvents()

    @staticmethod
    def usage(obj: dict) -> dict | None:
        r = final_response(obj)
        return chat_usage(r.get("usage")) if r else None

    def answer_id(self, obj: dict) -> str:
        return self.rid

    def _dress(self, r: dict, report: dict | None = None) -> dict:
        r = {**r, "id": self.rid, "previous_response_id": self.previous_id, "store": self.keep,
             "metadata": self.req.metadata or {}}
        return {**r, "proxray": report} if report is not None else r

    def dress(self, obj: dict, report: dict | None = None) -> dict:
        """An object of the model's answer as the client sees it: the response (an answer, or an event's) with the
        gateway's id and fields, and the report on the first event's and the last event's response."""
        if obj.get("object") == "response":
            return self._dress(obj, report)
        if isinstance(obj.get("response"), dict):
            first_or_last = obj.get("type") == "response.created" or obj.get("type") in TERMINAL
            return {**obj, "response": self._dress(obj["response"], report if first_or_last else None)}
        return obj

    async def _kept(self, obj: dict) -> dict:
        """``obj``, its response stored where it is final — or, where it could not be, saying so: ``store: false``
        and the reason in its report (``proxray.not_stored``)."""
        r = final_response(obj)
        if r is not None and self.keep:
            why = await self.store.put(self.rid, {"response": r, "input": self.items}, self.previous_id, self.key)
            if why is not None:
                return unstored(obj, why)
        return obj

    async def answer(self, obj: dict, report: dict) -> dict:
        """The whole response (not streamed), stored first."""
        return await self._kept(self.dress(obj, report))

    async def shown(self, head: list, rest, report: dict):
        """(the stream's first objects, the rest of it) as the client sees them; the response stored before its last
        event goes out."""
        head = [await self._kept(self.dress(o, report)) for o in head]

        async def watched():
            async for obj in rest:
                yield obj if is_error(obj) else await self._kept(self.dress(obj, report))

        return head, Stream(watched(), rest)


def unstored(obj: dict, why: str) -> dict:
    """A response (or an event's) as it went out unstored: ``store: false``, ``proxray.not_stored`` saying why."""
    if obj.get("object") == "response":
        return {**obj, "store": False, "proxray": {**(obj.get("proxray") or {}), "not_stored": why}}
    if isinstance(obj.get("response"), dict):
        return {**obj, "response": unstored(obj["response"], why)}
    return obj


def replayable(item: dict) -> dict | None:
    """An earlier turn's item as it is sent again (``store: false``): without the server-side ``id`` it had, which the
    model's endpoint never stored (OpenAI answers 404 for an item it does not hold); a reasoning item without its
    ``encrypted_content`` cannot be replayed at all (None)."""
    if item.get("type") == "reasoning" and not item.get("encrypted_content"):
        return None
    return {k: v for k, v in item.items() if k != "id"}


async def begin(req, client, native: set, store, spec, default_max_tokens: int, key: str | None) -> ResponsesTurn:
    """The turn of a parsed ``ResponsesRequest`` (``client``: the model client; ``native``: the models that serve
    ``/v1/responses`` themselves): the conversation ``previous_response_id`` continues read from the store (404 naming
    it where it is not held for this key)."""
    records = await store.conversation(req.previous_response_id, key) if req.previous_response_id else []
    return ResponsesTurn(req, records, default_max_tokens, client, native, store, spec.store, key)
