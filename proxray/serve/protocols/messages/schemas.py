"""A Messages request as the gateway reads it, and errors in Anthropic's shape.

The gateway checks only what it needs and what bounds a request's work; every other field (``thinking``,
``context_management``, ``output_config``, ``metadata``, ``service_tier``, …) is kept as sent: relayed to endpoints
that serve Messages, and otherwise handled by the translation's stated rule (``translate``)."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from proxray.serve.protocols.base import MAX_CONTENT_CHARS, MAX_MESSAGES, RoutingOptions
from proxray.serve.protocols.core import MAX_LIMIT

MAX_BLOCKS = 512  # content blocks per message (an agent's turn holds many tool results)
MAX_TOOLS = 256

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               500: "api_error", 529: "overloaded_error"}


def anthropic_error(status: int, message: str, param: str | None = None) -> tuple[int, dict]:
    """(status, body) of an error as Anthropic answers it: ``{"type": "error", "error": {"type", "message"}}``. The
    gateway's 503 (no replica answers, a shared actor restarting) is Anthropic's 529 ``overloaded_error``; a status
    Anthropic has no type for is an ``api_error`` (5xx) or an ``invalid_request_error`` (4xx), its status kept."""
    if status == 503:
        status = 529
    kind = ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    if param and param not in message:
        message = f"{param}: {message}"
    return status, {"type": "error", "error": {"type": kind, "message": message}}


def harness(text: str) -> bool:
    """A text block an agent harness wrote, not the user (Claude Code's ``<system-reminder>`` blocks)."""
    t = text.strip()
    return t.startswith("<system-reminder>") and t.endswith("</system-reminder>")


# ---- content blocks: a discriminated union on ``type``; a type the gateway does not read passes as it is ----------
class _Block(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = Field(min_length=1, max_length=64)
    text: str | None = None  # a text block's; every other block has none


class TextBlock(_Block):
    type: Literal["text"]
    text: str = Field(max_length=MAX_CONTENT_CHARS)


class Base64Source(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["base64"]
    media_type: str = Field(min_length=1, max_length=128)
    data: str


class UrlSource(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["url"]
    url: str = Field(min_length=1, max_length=8192)


class OtherSource(BaseModel):
    """A source the gateway does not translate (a file id, text): relayed as it is, refused by name on the way to chat."""
    model_config = ConfigDict(extra="allow")
    type: str = Field(min_length=1, max_length=64)


def kind_of(known: tuple):
    """The discriminator of a union on ``type``: the type where it is one of ``known``, else ``"other"``."""
    def kind(v) -> str:
        found = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
        return found if found in known else "other"

    return kind


Source = Annotated[Union[Annotated[Base64Source, Tag("base64")], Annotated[UrlSource, Tag("url")],
                         Annotated[OtherSource, Tag("other")]], Discriminator(kind_of(("base64", "url")))]


class ImageBlock(_Block):
    type: Literal["image"]
    source: Source


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=128)
    input: dict[str, Any]


class OtherBlock(_Block):
    """A block the gateway does not read (a document, a search result, a server tool's call or result, …)."""


Inner = Annotated[Union[Annotated[TextBlock, Tag("text")], Annotated[ImageBlock, Tag("image")],
                        Annotated[OtherBlock, Tag("other")]], Discriminator(kind_of(("text", "image")))]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[Inner] | None = None
    is_error: bool | None = None


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


Block = Annotated[Union[Annotated[TextBlock, Tag("text")], Annotated[ImageBlock, Tag("image")],
                        Annotated[ToolUseBlock, Tag("tool_use")], Annotated[ToolResultBlock, Tag("tool_result")],
                        Annotated[ThinkingBlock, Tag("thinking")], Annotated[OtherBlock, Tag("other")]],
                  Discriminator(kind_of(("text", "image", "tool_use", "tool_result", "thinking")))]


class Metadata(BaseModel):
    """``metadata``: Claude Code's ``user_id`` (a JSON string the gateway reads the session from: bounded)."""
    model_config = ConfigDict(extra="allow")
    user_id: str | None = Field(None, max_length=1024)


class MessageParam(BaseModel):
    """One turn: ``user`` or ``assistant`` (a ``system`` turn inside ``messages``, as Claude Code sends one, is read
    as system text)."""

    model_config = ConfigDict(extra="allow")
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]

    @field_validator("content")
    @classmethod
    def _bounded(cls, v):
        if isinstance(v, str) and len(v) > MAX_CONTENT_CHARS:
            raise ValueError(f"at most {MAX_CONTENT_CHARS} characters per message (got {len(v)})")
        if isinstance(v, list) and len(v) > MAX_BLOCKS:
            raise ValueError(f"at most {MAX_BLOCKS} content blocks per message (got {len(v)})")
        return v

    def text(self) -> str:
        """The turn's own text: the string, or its text blocks (tool results, images, thinking left out)."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(b.text for b in self.content if b.type == "text" and b.text)

    def ask(self) -> str:
        """The turn's text as the router reads it: its text without the blocks an agent harness adds to a user's turn
        (a block that is one ``<system-reminder>…</system-reminder>``, as Claude Code sends them)."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(b.text for b in self.content if b.type == "text" and b.text and not harness(b.text))

    def only_tool_results(self) -> bool:
        """A user turn that carries tool results and no text of the user's: not an ask."""
        return (self.role == "user" and isinstance(self.content, list) and
                any(b.type == "tool_result" for b in self.content) and not self.ask().strip())


class ToolParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=128)
    type: str | None = None
    input_schema: dict | None = None


class MessagesRequest(BaseModel):
    """``POST /v1/messages``: what the gateway reads or bounds; everything else kept and passed on by rule."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=512)
    max_tokens: int = Field(ge=1, le=MAX_LIMIT)
    messages: list[MessageParam] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | list[TextBlock] | None = None
    stream: bool | None = False
    stop_sequences: list[str] | None = Field(None, max_length=64)
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    tools: list[ToolParam] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: dict | None = None
    metadata: Metadata | None = None
    proxray: RoutingOptions = Field(default_factory=RoutingOptions)

    @field_validator("tool_choice")
    @classmethod
    def _choice(cls, v):
        if v is not None and v.get("type") not in ("auto", "any", "tool", "none"):
            raise ValueError("tool_choice.type: one of auto, any, tool, none")
        if v is not None and v.get("type") == "tool" and not v.get("name"):
            raise ValueError("tool_choice: type 'tool' needs the tool's name")
        return v

    def system_text(self) -> str:
        """The system prompt's text (``system``, then any system turn inside ``messages``)."""
        parts = [self.system] if isinstance(self.system, str) else [b.text for b in self.system or [] if b.text]
        return "\n".join([*parts, *(m.text() for m in self.messages if m.role == "system")])

    def turns(self) -> list:
        """(role, text) of the conversation as the routing text reads it: the system text first, then each turn's
        own text (``ask``: without the harness's reminders) — a user turn that only returns tool results is not the
        user's (read as a tool turn)."""
        out = [("system", self.system_text())]
        for m in self.messages:
            if m.role != "system":
                out.append(("tool" if m.only_tool_results() else m.role, m.ask()))
        return out

    def forward(self) -> dict:
        """The body as sent, the routing options removed."""
        return self.model_dump(exclude={"proxray"}, exclude_unset=True, exclude_none=False, mode="json")


class CountTokensRequest(MessagesRequest):
    """``POST /v1/messages/count_tokens``: a Messages request without ``max_tokens``."""

    max_tokens: int | None = Field(None, ge=1, le=MAX_LIMIT)


def anthropic_shape(e) -> tuple[int, dict]:
    """(status, body) of a ``RequestError`` in Anthropic's shape (the Messages routes' errors)."""
    return anthropic_error(e.status, e.message, e.param)
