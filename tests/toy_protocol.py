"""A toy client protocol, written as a contributor would add one: ``POST /v1/ask`` takes ``{"model", "question",
"max_tokens", "stream"}`` and answers ``{"answer", "model", "used"}`` or a stream of ``start`` / ``piece`` / ``done``
events. Nothing in the package names it: its row is added to the app's protocol table (``proxray.serve.app.build(args, protocols)``)
and the gateway routes, streams, budgets and reports it like any other. A module of its own (not the test's) so that
the ingress's replicas can import it."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from proxray.serve.protocols import PROTOCOLS
from proxray.serve.protocols.base import Protocol, RoutingOptions, Turn, sse_data, text_of
from proxray.serve.protocols.core import EventsFromChat, ViaChat, completion_parts, one_limit


class AskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=512)
    question: str = Field(min_length=1, max_length=4000)
    max_tokens: int | None = Field(None, ge=1, le=512)
    stream: bool = False
    proxray: RoutingOptions = Field(default_factory=RoutingOptions)


class AskWriter:
    """The toy's events of a chat stream (told by the core's state machine)."""

    def __init__(self, model: str):
        self.model = model

    def start(self) -> list:
        return [{"type": "start", "model": self.model}]

    def reasoning(self, text: str) -> list:
        return []

    def text(self, text: str) -> list:
        return [{"type": "piece", "text": text}]

    def tool(self, index, call_id, name, arguments) -> list:
        return []

    def end(self, finish, matched, usage) -> list:
        return [{"type": "done", "finish": finish, "used": usage.chat() if usage else None}]


class AskEvents:
    end = "data: [END]\n\n"

    def event(self, obj: dict) -> str:
        return sse_data(obj)

    def error(self, body: dict) -> str:
        return sse_data(body)


def whole(obj: dict, model: str) -> dict:
    msg, finish, _, usage = completion_parts(obj)
    return {"answer": msg.get("content") or "", "model": model, "finish": finish,
            "used": usage.chat() if usage else None}


class AskTurn(Turn):
    param = "question"

    def __init__(self, req, ctx):
        super().__init__(ctx)
        self.req = req
        self.body = one_limit({"model": req.model, "question": req.question, "stream": req.stream,
                               **({"max_tokens": req.max_tokens} if req.max_tokens else {})},
                              ("max_tokens",), ctx.args.default_max_tokens)
        chat = {"messages": [{"role": "user", "content": req.question}], "max_tokens": self.body["max_tokens"]}
        if req.stream:
            chat.update(stream=True, stream_options={"include_usage": True})
        self.client = ViaChat(ctx.client, set(), chat, {}, whole=whole,
                              events=lambda model: EventsFromChat(AskWriter(model)), words={})

    def text(self, policy: str) -> str:
        return text_of([("user", self.req.question)], policy)

    @staticmethod
    def usage(obj: dict) -> dict | None:
        return obj.get("used")


async def begin(req, ctx) -> AskTurn:
    return AskTurn(req, ctx)


def has_content(obj: dict) -> bool:
    return obj.get("type") in ("piece", "done") or "answer" in obj


ASK = Protocol("ask", "/v1/ask", AskRequest, begin, "/ask", AskEvents, has_content)
TABLE = {**PROTOCOLS, ASK.route: ASK}
