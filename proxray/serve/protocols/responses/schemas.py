"""``POST /v1/responses``: the request as the gateway reads and bounds it, and the app's ``responses:`` settings.

As for chat, the gateway checks what it needs and what bounds a request's work; every other field is kept as sent
(``extra="allow"``) and reaches the model, which honours it or refuses it by name. ``background`` and ``conversation``
are refused here by name: the endpoint answers while the client waits, and continues a conversation by
``previous_response_id``."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from proxray.serve.protocols.base import MAX_CONTENT_CHARS, MAX_MESSAGES, RoutingOptions
from proxray.serve.protocols.core import MAX_LIMIT, one_limit


class TextConfig(BaseModel):
    """``text``: the output's format (``{"type": "text" | "json_object" | "json_schema", …}``) and verbosity."""
    model_config = ConfigDict(extra="allow")
    format: dict | None = None
    verbosity: str | None = Field(None, max_length=16)

    @field_validator("format")
    @classmethod
    def _format(cls, v):
        if v is not None and not isinstance(v.get("type"), str):
            raise ValueError("text.format needs a type: text, json_object or json_schema")
        return v


class ReasoningConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    effort: str | None = Field(None, max_length=16)
    summary: str | None = Field(None, max_length=16)
    generate_summary: str | None = Field(None, max_length=16)


def _parts(value, where: str) -> None:
    """A list of content parts (or tool outputs): each an object with a string ``type``; a text part's ``text`` (of
    ``input_text``, ``output_text``, ``text``, ``summary_text``, ``reasoning_text``, …) a string of at most
    ``MAX_CONTENT_CHARS``."""
    if isinstance(value, list):
        for j, part in enumerate(value):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise ValueError(f"{where}[{j}]: a content part is an object with a string type (got "
                                 f"{type(part).__name__})")
            text = part.get("text")
            if part["type"].endswith("text") and not (isinstance(text, str) and len(text) <= MAX_CONTENT_CHARS):
                raise ValueError(f"{where}[{j}].text: a {part['type']} part's text is a string of at most "
                                 f"{MAX_CONTENT_CHARS} characters (got {type(text).__name__})")


class ResponsesRequest(BaseModel):
    """The fields the gateway reads or bounds; the rest passes through."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=512)
    input: str | list[dict] = Field(description="a string (one user message) or a list of input items")
    instructions: str | None = Field(None, max_length=MAX_CONTENT_CHARS)
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_LIMIT)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stream: bool | None = False
    store: bool | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)
    previous_response_id: str | None = Field(None, min_length=1, max_length=256)
    tools: list[dict] | None = Field(None, max_length=128)
    tool_choice: str | dict | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_tool_calls: int | None = Field(None, ge=1)
    include: list[str] | None = Field(None, max_length=16)
    truncation: str | None = Field(None, max_length=16)
    background: bool | None = None
    conversation: object | None = None
    proxray: RoutingOptions = Field(default_factory=RoutingOptions)

    @field_validator("input")
    @classmethod
    def _bounded(cls, v):
        if isinstance(v, str):
            if not v.strip():
                raise ValueError("must not be empty")
            if len(v) > MAX_CONTENT_CHARS:
                raise ValueError(f"at most {MAX_CONTENT_CHARS} characters (got {len(v)})")
            return v
        if not v or len(v) > MAX_MESSAGES:
            raise ValueError(f"a list of 1 to {MAX_MESSAGES} input items")
        for i, item in enumerate(v):
            if not isinstance(item.get("type", "message"), str):
                raise ValueError(f"input[{i}].type: a string")
            content = item.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise ValueError(f"input[{i}].content: a string or a list of content parts")
            _parts(content, f"input[{i}].content")
            output = item.get("output")
            if output is not None and not isinstance(output, (str, list)):
                raise ValueError(f"input[{i}].output: a string or a list of content parts")
            _parts(output, f"input[{i}].output")
        return v

    @field_validator("tools")
    @classmethod
    def _tools(cls, v):
        for i, tool in enumerate(v or []):
            if not isinstance(tool.get("type"), str):
                raise ValueError(f"tools[{i}]: a tool is an object with a string type")
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v):
        bad = [k for k, x in (v or {}).items() if len(k) > 64 or len(x) > 512]
        if bad:
            raise ValueError(f"keys of at most 64 and values of at most 512 characters (not {bad[0][:64]!r})")
        return v

    @model_validator(mode="after")
    def _served(self):
        if self.background:
            raise ValueError("background: not served; this endpoint answers while the client waits (or streams)")
        if self.conversation is not None:
            raise ValueError("conversation: the Conversations API is not served; continue a conversation with "
                             "previous_response_id")
        return self

    def forward(self, default_max_tokens: int) -> dict:
        """The request as sent, without the gateway's own fields (``proxray``, ``previous_response_id``, ``store``,
        ``background``, ``conversation``); a request without a token limit gets the app's ``default_max_tokens``, one
        with another API's limit field beside or instead of ``max_output_tokens`` is refused (``core.one_limit``)."""
        body = self.model_dump(exclude={"proxray", "previous_response_id", "store", "background", "conversation"},
                               exclude_unset=True, mode="json")
        return one_limit(body, ("max_output_tokens",), default_max_tokens)

