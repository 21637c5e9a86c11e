"""``POST /v1/responses``: the request as the gateway reads and bounds it, and the app's ``responses:`` settings.

As for chat, the gateway checks what it needs and what bounds a request's work; every other field is kept as sent
(``extra="allow"``) and reaches the model, which honours it or refuses it by name. ``background`` and ``conversation``
are refused here by name: the endpoint answers while the client waits, and continues a conversation by
``previous_response_id``."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from proxray.serve.protocols.base import MAX_CONTENT_CHARS, MAX_MESSAGES, RoutingOptions
from proxray.serve.protocols.core import one_limit


class ResponsesRequest(BaseModel):
    """The fields the gateway reads or bounds; the rest passes through."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=512)
    input: str | list[dict] = Field(description="a string (one user message) or a list of input items")
    instructions: str | None = Field(None, max_length=MAX_CONTENT_CHARS)
    max_output_tokens: int | None = Field(None, ge=1, le=1_000_000)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stream: bool | None = False
    store: bool | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)
    previous_response_id: str | None = Field(None, min_length=1, max_length=256)
    tools: list[dict] | None = Field(None, max_length=128)
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

