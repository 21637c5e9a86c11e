"""One ``POST /v1/messages`` through the gateway, and the models as the Messages API sees them.

``models`` relays the request as it is to a model that serves ``/v1/messages`` itself (an endpoint whose
``protocols`` list ``messages``: Anthropic's API, vLLM's own server), the client's ``anthropic-version`` and ``anthropic-beta``
with it, and calls every other model through chat completions (``translate``), so fallback, streaming, usage, cost and
budgets are the chat path's. ``MessagesTurn`` is what the ingress needs of one request: the body, its routing text
(the user's ask: the last user turn with text of its own — a turn that only returns tool results is not one), its
session (``X-Claude-Code-Session-Id``, else the ``session_id`` in ``metadata.user_id``: a conversation of the key's),
whether it continues a tool loop (kept on the model that asked for the tool), the answer as the client sees it
(the ``proxray`` report in the message, or in ``message_start``'s message when streamed)."""
from __future__ import annotations

import json

from proxray.serve.config import ROUTER_MODEL
from proxray.serve.errors import RequestError, is_error
from proxray.serve.protocols.base import Turn, sse_data, text_of
from proxray.serve.protocols.core import LIMIT_FIELDS, Usage, ViaChat, dropped_for, one_limit
from proxray.serve.protocols.messages.schemas import anthropic_error
from proxray.serve.protocols.messages.translate import CHAT_TO_MESSAGES, events_from_chat, from_chat, to_chat
from proxray.serve.wire import COUNT_PATH, UpstreamHeaders

FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")
DEFAULT_VERSION = "2023-06-01"  # anthropic-version where the client sends none
SESSION_HEADER = "x-claude-code-session-id"
LIMITS = ("max_tokens",)
CONTENT = ("content_block_delta", "message_delta", "message_stop")


class AnthropicEvents:
    """Messages streams: ``event: <type>`` and ``data: {json}`` per event, nothing after ``message_stop``; a failure
    after the first byte is an ``error`` event in Anthropic's shape."""

    end = ""

    def event(self, obj: dict) -> str:
        return f"event: {obj.get('type', 'message')}\n{sse_data(obj)}"

    def error(self, body: dict) -> str:
        err = body.get("error") or {}
        if body.get("type") == "error":  # already Anthropic's (a relayed endpoint's own error event)
            return self.event(body)
        status = err.get("code") if isinstance(err.get("code"), int) else 500
        return self.event(anthropic_error(status, str(err.get("message")))[1])


def has_content(obj: dict) -> bool:
    """An event that commits the stream to its model: a block's delta or the message's end."""
    return obj.get("type") in CONTENT


def upstream_headers(headers) -> UpstreamHeaders:
    """What an endpoint that serves Messages is sent beside the body: the client's ``anthropic-version`` (default
    ``DEFAULT_VERSION``) and ``anthropic-beta`` (``priced_betas``), and the endpoint's key also as ``x-api-key``
    (Anthropic reads it there); no other header of the client's."""
    kept = {h: str(headers[h])[:1024] for h in FORWARDED_HEADERS if headers.get(h)}
    return UpstreamHeaders({"anthropic-version": DEFAULT_VERSION, **kept}, key_header="x-api-key",
                           for_price=priced_betas)


LONG_CONTEXT_BETAS = ("context-1m-",)  # betas that turn on a dearer price tier: Anthropic's 1M-token context


def priced_betas(headers: dict, price) -> dict:
    """``headers`` as a model at ``price`` is sent them: an ``anthropic-beta`` that turns on a price tier the model's
    price does not have (the 1M-token context, billed 2x past 200,000 tokens, where it has no ``long_context``) is
    left out, so nothing is billed above what the gateway charges. A model with no price is sent them all."""
    betas = headers.get("anthropic-beta")
    if not betas or price is None or price.long_context is not None:
        return headers
    kept = [b for b in (x.strip() for x in betas.split(",")) if b and not b.startswith(LONG_CONTEXT_BETAS)]
    rest = {k: v for k, v in headers.items() if k != "anthropic-beta"}
    return {**rest, "anthropic-beta": ",".join(kept)} if kept else rest


def models(client, native: set, body: dict, headers: UpstreamHeaders) -> ViaChat:
    """The model client of one Messages request ``body``: relayed to the models in ``native`` (with ``headers``),
    translated to chat completions (once, here) for the rest."""
    chat, problems, dropped = to_chat(body)
    stops = body.get("stop_sequences")
    return ViaChat(client, native, chat, problems, whole=lambda obj, model: from_chat(obj, model, stops),
                   events=lambda model: events_from_chat(model, stops), words=CHAT_TO_MESSAGES,
                   native_body=lambda b: {**b, UpstreamHeaders.FIELD: headers}, dropped=dropped)


async def count_tokens(via: ViaChat, model: str, body: dict) -> dict:
    """``{"input_tokens": n}`` for ``model``: the endpoint's own count where it serves Messages, else an estimate from
    the request as that model reads it (its chat form: a token for every 4 characters)."""
    body = {k: v for k, v in body.items() if k not in LIMIT_FIELDS}  # a count generates nothing: nothing to book
    if model in via.native:
        async for obj in via.client.stream(model, COUNT_PATH, via.native_body({**body, "model": model}), True):
            if is_error(obj):
                raise RequestError(obj["error"].get("code") or 502, obj["error"]["message"])
            return {"input_tokens": int(obj.get("input_tokens") or 0)}
    chars = len(json.dumps({k: via.chat[k] for k in ("messages", "tools") if k in via.chat}))
    return {"input_tokens": (chars + 3) // 4, "proxray": {"model": model, "estimated": True}}


def session_of(headers, metadata) -> str | None:
    """A Messages conversation's id: the ``X-Claude-Code-Session-Id`` header, else the ``session_id`` Claude Code puts
    in ``metadata.user_id`` (a JSON string, bounded at the boundary); None where the client sends neither."""
    found = headers.get(SESSION_HEADER)
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else getattr(metadata, "user_id", None)
    if not found and isinstance(user_id, str):
        try:
            parsed = json.loads(user_id)
        except (ValueError, RecursionError):
            parsed = None
        found = parsed.get("session_id") if isinstance(parsed, dict) else None
    return str(found)[:256] if found else None


class MessagesTurn(Turn):
    """One Messages request: its body (the request as sent, ``model`` rewritten per candidate), the client for it and
    what the ingress reads of it; its conversation's model comes from the conversations book (its session)."""

    def __init__(self, req, ctx):
        super().__init__(ctx)
        self.req = req
        self.body = one_limit(req.forward(), LIMITS)
        self.headers = upstream_headers(ctx.headers)
        self.client = models(ctx.client, ctx.native, self.body, self.headers)
        self.session = session_of(ctx.headers, req.metadata)
        self.tool_loop = req.messages[-1].only_tool_results()  # the model that asked for the tool answers
        self._usage: dict = {}

    def text(self, policy: str) -> str:
        text = text_of(self.req.turns(), policy)
        if self.req.model == ROUTER_MODEL and not text.strip():
            raise RequestError(400, "messages: no text to route on (a user turn with text of its own)", "messages")
        return text

    def usage(self, obj: dict) -> dict | None:
        """The answer's usage in chat's words, from the message, or from a stream's ``message_start`` (input and cache
        tokens) and ``message_delta`` (output tokens, and any other count sent again there)."""
        kind = obj.get("type")
        u = (obj.get("message") or {}).get("usage") if kind == "message_start" else obj.get("usage")
        if kind not in ("message", "message_start", "message_delta") or not isinstance(u, dict):
            return None
        self._usage.update({k: v for k, v in u.items() if v is not None})
        if kind == "message_start":
            return None
        used = Usage.of_messages(self._usage)
        if used is None or used.prompt == used.output == 0:  # no usage came (a chat model that sends none): charged
            return None  # as an answer without usage, at its hold, never at 0
        return used.chat()

    def answer_id(self, obj: dict) -> str | None:
        return obj.get("id") or (obj.get("message") or {}).get("id")

    def _report(self, report: dict) -> dict:
        return dropped_for(self.client, report)

    async def answer(self, obj: dict, report: dict) -> dict:
        return {**obj, "proxray": self._report(report)}

    async def shown(self, head: list, rest, report: dict):
        shown = [{**o, "message": {**o["message"], "proxray": self._report(report)}}
                 if o.get("type") == "message_start" else o for o in head]
        return shown, rest


async def begin(req, ctx) -> MessagesTurn:
    return MessagesTurn(req, ctx)
