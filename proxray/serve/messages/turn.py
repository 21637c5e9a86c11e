"""One ``POST /v1/messages`` through the gateway, and the models as the Messages API sees them.

``MessagesModels`` relays the request as it is to a model that serves ``/v1/messages`` itself (an endpoint with
``messages_api: true``: Anthropic's API, vLLM's own server), the client's ``anthropic-version`` and ``anthropic-beta``
with it, and calls every other model through chat completions (``translate``), so fallback, streaming, usage, cost and
budgets are the chat path's. ``MessagesTurn`` is what the ingress needs of one request: the body, its routing text
(the user's ask: the last user turn with text of its own — a turn that only returns tool results is not one), its
session (``X-Claude-Code-Session-Id``, else the ``session_id`` in ``metadata.user_id``: a conversation of the key's),
whether it continues a tool loop (kept on the model that asked for the tool), the answer as the client sees it
(the ``proxray`` report in the message, or in ``message_start``'s message when streamed)."""
from __future__ import annotations

import json

from proxray.serve.deployments.endpoint_server import HEADERS_FIELD  # the client's anthropic-* headers, relayed
from proxray.serve.messages.schemas import anthropic_error
from proxray.serve.messages.translate import CHAT_TO_MESSAGES, EventsFromChat, from_chat, to_chat
from proxray.serve.request.errors import RequestError, error, is_error
from proxray.serve.request.schemas import ROUTER_MODEL, text_of
from proxray.serve.request.sse import event
from proxray.serve.responses.turn import Stream, single, via_chat

FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")
SESSION_HEADER = "x-claude-code-session-id"


class AnthropicEvents:
    """Messages streams: ``event: <type>`` and ``data: {json}`` per event, nothing after ``message_stop``; a failure
    after the first byte is an ``error`` event in Anthropic's shape."""

    end = ""

    def event(self, obj: dict) -> str:
        return f"event: {obj.get('type', 'message')}\n{event(obj)}"

    def error(self, body: dict) -> str:
        err = body.get("error") or {}
        if body.get("type") == "error":  # already Anthropic's (a relayed endpoint's own error event)
            return self.event(body)
        status = err.get("code") if isinstance(err.get("code"), int) else 500
        return self.event(anthropic_error(status, str(err.get("message")))[1])


class MessagesModels:
    """The model client (``stream``, ``refusals``) for one Messages request ``body``: relayed to the models in
    ``native`` (with ``headers``), translated to chat completions (once, here) for the rest."""

    def __init__(self, client, native: set, body: dict, headers: dict):
        self.client, self.native, self.headers = client, native, headers
        self.chat, self.problems, self.dropped = to_chat(body)

    def stream(self, model: str, endpoint: str, body: dict, patient: bool = True):
        if model in self.native:
            return self.client.stream(model, endpoint, {**body, HEADERS_FIELD: self.headers}, patient)
        if self.problems:
            name = sorted(self.problems)[0]
            return Stream(single(error(400, f"model {model!r} answers through chat completions; "
                                          f"{self.problems[name]}", name)), None)
        inner = self.client.stream(model, "chat", {**self.chat, "model": model}, patient)
        stops = body.get("stop_sequences")
        return Stream(via_chat(inner, body.get("stream"), lambda obj: from_chat(obj, model, stops),
                               EventsFromChat(model, stops)), inner)

    async def refusals(self, models, body: dict, endpoint: str) -> dict:
        """``{model: [parameters it cannot honour]}``: a translated model's, in the request's words (a relayed model
        takes the request as it is)."""
        translated = await self.client.refusals([m for m in models if m not in self.native], self.chat, "chat")
        return {m: sorted(set(self.problems) | {CHAT_TO_MESSAGES.get(p, p) for p in refused})
                for m, refused in translated.items()}

    async def count_tokens(self, model: str, body: dict) -> dict:
        """``{"input_tokens": n}`` for ``model``: the endpoint's own count where it serves Messages, else an estimate
        from the request as that model reads it (its chat form: a token for every 4 characters)."""
        if model in self.native:
            async for obj in self.client.stream(model, "count_tokens", {**body, "model": model,
                                                                        HEADERS_FIELD: self.headers}, True):
                if is_error(obj):
                    raise RequestError(obj["error"].get("code") or 502, obj["error"]["message"])
                return {"input_tokens": int(obj.get("input_tokens") or 0)}
        chars = len(json.dumps({k: self.chat[k] for k in ("messages", "tools") if k in self.chat}))
        return {"input_tokens": (chars + 3) // 4, "proxray": {"model": model, "estimated": True}}


def session_of(headers, metadata: dict | None) -> str | None:
    """A Messages conversation's id: the ``X-Claude-Code-Session-Id`` header, else the ``session_id`` Claude Code puts
    in ``metadata.user_id`` (a JSON string); None where the client sends neither."""
    found = headers.get(SESSION_HEADER)
    if not found and isinstance((metadata or {}).get("user_id"), str):
        try:
            found = (json.loads(metadata["user_id"]) or {}).get("session_id")
        except (ValueError, AttributeError):
            found = None
    return str(found)[:256] if found else None


class MessagesTurn:
    """One Messages request: its body (the request as sent, ``model`` rewritten per candidate), the client for it and
    what the ingress reads of it."""

    endpoint, param, hide_usage = "messages", "messages", False
    previous = previous_id = None  # its conversation's model comes from the conversations book (its session)

    def __init__(self, req, client, native: set, headers):
        self.req = req
        self.body = req.forward()
        self.body.pop(HEADERS_FIELD, None)
        kept = {h: headers[h] for h in FORWARDED_HEADERS if headers.get(h)}
        self.client = MessagesModels(client, native, self.body, kept)
        self.session = session_of(headers, req.metadata)
        self.tool_loop = req.messages[-1].only_tool_results()  # the model that asked for the tool answers
        self._usage: dict = {}

    def text(self, policy: str) -> str:
        text = text_of(self.req.turns(), policy)
        if self.req.model == ROUTER_MODEL and not text.strip():
            raise RequestError(400, "messages: no text to route on (a user turn with text of its own)", "messages")
        return text

    def sse(self) -> AnthropicEvents:
        return AnthropicEvents()

    def usage(self, obj: dict) -> dict | None:
        """The answer's usage in chat's words, from the message, or from a stream's ``message_start`` (input tokens)
        and ``message_delta`` (output tokens, and input where sent)."""
        kind = obj.get("type")
        u = (obj.get("message") or {}).get("usage") if kind == "message_start" else obj.get("usage")
        if kind not in ("message", "message_start", "message_delta") or not isinstance(u, dict):
            return None
        for k in ("input_tokens", "output_tokens"):
            if u.get(k) is not None:
                self._usage[k] = int(u[k])
        if kind == "message_start":
            return None
        return {"prompt_tokens": self._usage.get("input_tokens", 0),
                "completion_tokens": self._usage.get("output_tokens", 0)}

    @staticmethod
    def answer_id(obj: dict) -> str | None:
        return obj.get("id") or (obj.get("message") or {}).get("id")

    def _report(self, report: dict) -> dict:
        dropped = self.client.dropped if report.get("model") not in self.client.native else []
        return {**report, "dropped": dropped} if dropped else report

    async def answer(self, obj: dict, report: dict) -> dict:
        return {**obj, "proxray": self._report(report)}

    async def shown(self, head: list, rest, report: dict):
        shown = [{**o, "message": {**o["message"], "proxray": self._report(report)}}
                 if o.get("type") == "message_start" else o for o in head]
        return shown, rest
