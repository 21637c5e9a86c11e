"""One ``POST /v1/responses`` through the gateway, and the models as the Responses API sees them.

``models`` calls a model that serves ``/v1/responses`` itself (an endpoint whose ``protocols`` list ``responses``)
with the request as it is, and every other through chat completions (``translate``), so fallback, streaming, usage,
cost and budgets work the same for both. ``ResponsesTurn`` is what the ingress needs of one request: the body every
candidate gets (the conversation rebuilt from the stored responses ``previous_response_id`` continues, sent with
``store: false``: the gateway keeps responses, not the model), its routing text, the model that answered the
conversation's last turn, the response as the client sees it (the gateway's id, ``previous_response_id``, ``store``,
``metadata`` and the ``proxray`` report), stored before its last event or its body reaches the client."""
from __future__ import annotations

from proxray.serve.config import ROUTER_MODEL
from proxray.serve.errors import RequestError, is_error
from proxray.serve.protocols.base import Turn, sse_data, text_of
from proxray.serve.protocols.core import Stream, Usage, ViaChat, dropped_for, new_id
from proxray.serve.protocols.responses.translate import (CHAT_TO_RESPONSES, TERMINAL, as_error, events_from_chat,
                                                         final_response, from_chat, input_items, shell, to_chat)

CONTENT = ("response.output_item.done", "response.completed", "response.incomplete")


class NamedEvents:
    """Responses API streams: ``event: <type>`` and ``data: {json}`` per event, nothing at the end; an error is an
    ``error`` event (its ``code``, ``message``, ``param`` and the next ``sequence_number``) that also holds the error
    object, so SDKs raise it as they raise a chat stream's."""

    end = ""

    def __init__(self):
        self.seq = 0

    def event(self, obj: dict) -> str:
        self.seq = max(self.seq, int(obj.get("sequence_number") or 0) + 1)
        return f"event: {obj.get('type', 'message')}\n{sse_data(obj)}"

    def error(self, body: dict) -> str:
        err = body["error"]
        return self.event({"type": "error", "code": str(err.get("code")), "message": err.get("message"),
                           "param": err.get("param"), "sequence_number": self.seq, "error": err})


def has_content(obj: dict) -> bool:
    """An event that commits the stream to its model: any delta (text, arguments, reasoning), a finished item or the
    response's end (a translated chat model's stream is read once translated)."""
    kind = obj.get("type")
    return isinstance(kind, str) and kind.startswith("response.") and (kind.endswith(".delta") or kind in CONTENT)


def models(client, native: set, body: dict, hosted_tools: str = "drop") -> ViaChat:
    """The model client of one Responses request ``body``: relayed to the models in ``native``, translated to chat
    completions (once, here) for the rest (``dropped``: what their translation left out, named in their answers)."""
    chat, problems, dropped = to_chat(body, hosted_tools)
    return ViaChat(client, native, chat, problems,
                   whole=lambda obj, model: from_chat(obj, shell(body, "resp_pending", model, None, False)),
                   events=lambda model: events_from_chat(shell(body, "resp_pending", model, None, False)),
                   words=CHAT_TO_RESPONSES, on_native=as_error, dropped=dropped)


class ResponsesTurn(Turn):
    """One Responses request: built by ``begin`` once the conversation it continues (``records``, oldest first) is
    read from the store; its conversation is ``previous_response_id``'s."""

    param = "input"

    def __init__(self, req, records: list, ctx):
        super().__init__(ctx)
        self.req, self.store, self.key, self.native = req, ctx.store, ctx.owner, ctx.native
        keep = ctx.args.responses.store
        self.rid = new_id("resp")
        self.keep = keep and req.store is not False  # the app stores responses and the request did not say no
        self.items = input_items(req.input)  # this request's own input items (input_items lists them)
        history = [replayable(x) for r in records for x in r["input"] + r["response"]["output"] if replayable(x)]
        self.previous = records[-1]["response"]["model"] if records else None  # the conversation's model
        self.previous_id = req.previous_response_id
        key = (req.model_extra or {}).get("prompt_cache_key")  # a client's session (Codex's): the conversation's id
        self.session = key if isinstance(key, str) and 0 < len(key) <= 256 else None
        self.body = req.forward(ctx.args.default_max_tokens)
        self.body.update(input=history + self.items, store=False)
        self.grown = bool(history)  # the stored conversation's items: more than the request's own body
        self.client = models(ctx.client, ctx.native, self.body, ctx.args.responses.hosted_tools)  # translated once
        self.turns = [(m["role"], m["content"] if isinstance(m["content"], str) else
                       "\n".join(p.get("text") or "" for p in m["content"] or [] if p.get("type") == "text"))
                      for m in self.client.chat["messages"]]

    def text(self, policy: str) -> str:
        text = text_of(self.turns, policy)
        if self.req.model == ROUTER_MODEL and not text.strip():
            raise RequestError(400, "input: no text to route on (a user message with text, here or in the "
                               "conversation previous_response_id continues)", "input")
        return text

    @staticmethod
    def usage(obj: dict) -> dict | None:
        r = final_response(obj)
        u = Usage.of_responses(r.get("usage"), r.get("output")) if r else None  # hosted tools' calls among its items
        if u is None:
            return None
        tier = r.get("service_tier")
        return {**u.chat(), "service_tier": tier} if isinstance(tier, str) else u.chat()

    def answer_id(self, obj: dict) -> str:
        return self.rid

    def _dress(self, r: dict, report: dict | None = None) -> dict:
        if report is not None:
            dropped_for(self.client, report)
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
        and the reason in its report (``proxray.not_stored``). A model that answered through chat read none of the
        request's reasoning items (chat has no field for them): they are not stored, so a conversation does not carry
        on loading what no model of it read."""
        r = final_response(obj)
        if r is not None and self.keep:
            items = self.items if r.get("model") in self.native else \
                [x for x in self.items if x.get("type") != "reasoning"]
            why = await self.store.put(self.rid, {"response": r, "input": items}, self.previous_id, self.key)
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


async def begin(req, ctx) -> ResponsesTurn:
    """The turn of a parsed ``ResponsesRequest``: the conversation ``previous_response_id`` continues read from the
    store (404 naming it where it is not held for this key)."""
    records = await ctx.store.conversation(req.previous_response_id, ctx.owner) if req.previous_response_id else []
    return ResponsesTurn(req, records, ctx)
