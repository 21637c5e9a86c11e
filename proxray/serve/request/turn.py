"""One chat or completions request through the gateway: the body every candidate gets, its routing text, and how its
answer is shown and counted (``proxray.serve.responses.turn.ResponsesTurn`` is the same for the Responses API)."""
from __future__ import annotations

from proxray.serve.request.schemas import ChatRequest, routing_text
from proxray.serve.request.sse import ChatEvents


class ChatTurn:
    """The request as sent with ``model`` rewritten and the app's ``default_max_tokens`` where it sets no limit; a
    stream asks every model for its usage (a client that did not ask does not get it)."""

    previous = previous_id = None  # a chat conversation's model is the conversations book's (proxray.conversation)
    session, tool_loop = None, False  # no client session of its own; a tool turn is routed as any other

    def __init__(self, req, endpoint: str, client, default_max_tokens: int):
        self.req, self.endpoint, self.client = req, endpoint, client
        self.param = "messages" if isinstance(req, ChatRequest) else "prompt"
        self.body = req.forward(req.model, default_max_tokens)
        self.hide_usage = not bool((self.body.get("stream_options") or {}).get("include_usage"))
        if req.stream:
            self.body["stream_options"] = {**(self.body.get("stream_options") or {}), "include_usage": True}

    def text(self, policy: str) -> str:
        return routing_text(self.req, policy)

    def sse(self) -> ChatEvents:
        return ChatEvents()

    @staticmethod
    def usage(obj: dict) -> dict | None:
        return obj.get("usage")

    @staticmethod
    def answer_id(obj: dict) -> str | None:
        return obj.get("id")

    async def answer(self, obj: dict, report: dict) -> dict:
        return {**obj, "proxray": report}

    async def shown(self, head: list, rest, report: dict):
        return [{**head[0], "proxray": report}, *head[1:]], rest
