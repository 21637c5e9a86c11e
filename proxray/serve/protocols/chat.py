"""The OpenAI chat completions and completions protocols: their request models, their stream format, and one request
through the gateway (``ChatTurn``: the request itself is the internal request, sent as it is with ``model`` rewritten).

The request models check only what the gateway itself needs and the limits that bound a request's work; every other
field is kept as sent (``extra="allow"``) and passed through to the chosen model, which honours it or refuses it by
name; a hint it does not take (``chat_fields.HINTS``) is left out of what it is sent and named in the answer
(``HintsDropped``)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from proxray.serve.protocols.base import (INT64, MAX_CONTENT_CHARS, MAX_MESSAGES, MAX_PARTS, Protocol, RoutingOptions,
                                          TextPart, Turn, sse_data, text_of)
from proxray.serve.protocols.chat_fields import HINTS
from proxray.serve.protocols.core import MAX_LIMIT, one_limit
from proxray.serve.wire import CHAT_PATH, COMPLETIONS_PATH

LIMITS = ("max_tokens", "max_completion_tokens")  # either; never both (core.one_limit)


class Message(BaseModel):
    """One chat message as sent; ``name``, ``tool_calls``, ``tool_call_id`` and the like pass through."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    @field_validator("content")
    @classmethod
    def _bounded(cls, v):
        if isinstance(v, str) and len(v) > MAX_CONTENT_CHARS:
            raise ValueError(f"at most {MAX_CONTENT_CHARS} characters per message (got {len(v)})")
        if isinstance(v, list):
            if len(v) > MAX_PARTS:
                raise ValueError(f"at most {MAX_PARTS} content parts per message (got {len(v)})")
            if sum(len(p.text or "") for p in v) > MAX_CONTENT_CHARS:
                raise ValueError(f"a message's text parts may hold at most {MAX_CONTENT_CHARS} characters")
        return v

    def text(self) -> str:
        """The message's text: the string, or its text parts joined by newlines (other parts left out)."""
        if isinstance(self.content, list):
            return "\n".join(p.text for p in self.content if p.type == "text" and p.text)
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class _Common(BaseModel):
    """Fields the gateway reads or bounds; everything else is kept (``extra``) and passed through."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=512)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_LIMIT)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_LIMIT)
    n: int | None = Field(None, ge=1, le=16)
    best_of: int | None = Field(None, ge=1, le=16)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=-INT64, lt=INT64)
    proxray: RoutingOptions = Field(default_factory=RoutingOptions)

    def forward(self, model: str, default_max_tokens: int) -> dict:
        """The body the chosen model gets: the request as sent with ``model`` rewritten and the routing
        options removed; a request without a token limit gets the app's ``default_max_tokens``, one with two is
        refused (``core.one_limit``)."""
        body = self.model_dump(exclude={"proxray"}, exclude_unset=True, mode="json")
        body["model"] = model
        return one_limit(body, LIMITS, default_max_tokens)


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)

    @model_validator(mode="after")
    def _has_user_text(self):
        if not any(m.role == "user" and m.text().strip() for m in self.messages):
            raise ValueError("messages: at least one user message with non-empty text is required")
        return self


class CompletionRequest(_Common):
    prompt: str | list[str]
    suffix: str | None = Field(None, max_length=MAX_CONTENT_CHARS)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("prompt: exactly one prompt per request is supported (each would route on its own)")
        text = v[0] if isinstance(v, list) else v
        if not text.strip():
            raise ValueError("prompt: must not be empty")
        if len(text) > MAX_CONTENT_CHARS:
            raise ValueError(f"prompt: at most {MAX_CONTENT_CHARS} characters")
        return v

    def text(self) -> str:
        return self.prompt[0] if isinstance(self.prompt, list) else self.prompt



def routing_text(req: ChatRequest | CompletionRequest, policy: str = "system+last_user") -> str:
    """The text the router embeds (``base.text_of`` of the messages' text parts); a completion request's is its
    prompt."""
    if isinstance(req, CompletionRequest):
        return req.text()
    return text_of([(m.role, m.text()) for m in req.messages], policy)


class ChatEvents:
    """Chat and completions streams: ``data: {json}`` per chunk, ``data: [DONE]`` at the end, an error as an error
    object."""

    end = "data: [DONE]\n\n"

    def event(self, obj: dict) -> str:
        return sse_data(obj)

    def error(self, body: dict) -> str:
        return sse_data(body)


def has_content(obj: dict) -> bool:
    """A chunk that commits the stream to its model: any text, a tool call, reasoning, a finish reason, or usage."""
    if obj.get("usage") and not obj.get("choices"):
        return True
    for c in obj.get("choices") or []:
        d = c.get("delta") or {}
        if c.get("text") or d.get("content") or d.get("tool_calls") or d.get("reasoning_content") or c.get("finish_reason"):
            return True
    return False


class HintsDropped:
    """The model client of a chat or completions request that carries hints (``chat_fields.HINTS``: a provider's prompt
    cache, metadata, storage, tier): a model that does not take one (its ``capabilities``) is sent the request without
    it, and the answer names what it was not sent (``dropped``); a model that takes them gets them as sent. Hints never
    make a model refuse a request."""

    def __init__(self, client, hints: frozenset):
        self.client, self.hints = client, hints
        self.dropped: dict = {}  # model -> the hints it was not sent

    async def learn(self, model: str, upstream: str) -> None:
        """Ask a named model what it takes (a routed request's candidates are asked by ``refusals``)."""
        if model in self.client.handles:
            await self.client.refusals([model], {}, upstream)

    def stream(self, model: str, upstream: str, body: dict, patient: bool = True):
        honoured = self.client.caps.get(model, {}).get(upstream)
        left = sorted(k for k in body if k in self.hints and body[k] is not None and honoured is not None
                      and k not in honoured)
        if left:
            self.dropped[model] = left
            body = {k: v for k, v in body.items() if k not in left}
        return self.client.stream(model, upstream, body, patient)

    async def refusals(self, models, body: dict, upstream: str) -> dict:
        return await self.client.refusals(models, {k: v for k, v in body.items() if k not in self.hints}, upstream)


class ChatTurn(Turn):
    """The request as sent with ``model`` rewritten and the app's ``default_max_tokens`` where it sets no limit; a
    stream asks every model for its usage (a client that did not ask does not get it). A chat conversation's model is
    the conversations book's (``proxray.conversation``, else the request's ``prompt_cache_key``: the client's own name
    for the prompts that share a cache); a tool turn is routed as any other. Hints go through ``HintsDropped``."""

    def __init__(self, req, ctx):
        super().__init__(ctx)
        self.req, self.client = req, ctx.client
        self.param = "messages" if isinstance(req, ChatRequest) else "prompt"
        self.body = req.forward(req.model, ctx.args.default_max_tokens)
        self.hide_usage = not bool((self.body.get("stream_options") or {}).get("include_usage"))
        if req.stream:
            self.body["stream_options"] = {**(self.body.get("stream_options") or {}), "include_usage": True}
        key = self.body.get("prompt_cache_key") if isinstance(req, ChatRequest) else None
        self.session = key if isinstance(key, str) and 0 < len(key) <= 256 else None  # the conversation's id
        hints = HINTS[isinstance(req, ChatRequest)]
        if any(k in hints for k in self.body):
            self.client = HintsDropped(ctx.client, hints)

    def text(self, policy: str) -> str:
        return routing_text(self.req, policy)

    def _named(self, report: dict) -> dict:
        """``report`` with ``dropped`` (in place: the answer's headers are written from it): the hints the model that
        answered was not sent."""
        if isinstance(self.client, HintsDropped) and self.client.dropped.get(report.get("model")):
            report["dropped"] = self.client.dropped[report["model"]]
        return report

    async def answer(self, obj: dict, report: dict) -> dict:
        return await super().answer(obj, self._named(report))

    async def shown(self, head: list, rest, report: dict):
        return await super().shown(head, rest, self._named(report))


async def begin(req, ctx) -> ChatTurn:
    turn = ChatTurn(req, ctx)
    if isinstance(turn.client, HintsDropped):
        await turn.client.learn(req.model, turn.upstream)
    return turn


def openai_params(module: str):
    """What an OpenAI-compatible endpoint takes for a protocol: the parameters the openai SDK's ``module`` declares
    for its create call (read when first asked: the SDK is imported then)."""
    def names() -> list:
        import importlib

        params = importlib.import_module(module)
        base = getattr(params, "CompletionCreateParamsBase", None) or params.ResponseCreateParamsBase
        return sorted({*base.__annotations__, "stream"})

    return names


CHAT = Protocol("chat", "/v1/chat/completions", ChatRequest, begin, CHAT_PATH, ChatEvents, has_content,
                honoured=openai_params("openai.types.chat.completion_create_params"),
                summary="OpenAI's chat completions: `model: \"proxray\"` (or an alias) is routed, any served model "
                        "id is passed through; `stream: true` answers server-sent events",
                mirrors="https://platform.openai.com/docs/api-reference/chat/create")
COMPLETIONS = Protocol("completions", "/v1/completions", CompletionRequest, begin, COMPLETIONS_PATH, ChatEvents,
                       has_content, honoured=openai_params("openai.types.completion_create_params"),
                       summary="OpenAI's legacy text completions (`prompt`), routed on the prompt",
                       mirrors="https://platform.openai.com/docs/api-reference/completions/create")
