"""What a client protocol is, declared once: the ``Protocol`` row every protocol fills (its route, request model,
error shape, stream format, content test, what a native endpoint takes, its translation through its ``Turn``), the
``Turn`` every request of any protocol becomes, the ``Context`` a turn is given of the app, and the request pieces every
protocol shares (the routing options, content parts, the routing text).

A request of any protocol crosses the same stages in the same order (``proxray.serve.ingress``): read and validate
its body (``request``), resolve its key and alias, ``begin`` its turn (the one internal request every candidate model
is sent, in the chat form the models take, or as it is to a model whose endpoint serves the protocol itself), plan,
admit, ask the candidates (``upstream``, ``has_content``), then answer or stream (``events``) and count its usage. A
new protocol is one module that builds a ``Protocol`` and one row of ``proxray.serve.protocols.PROTOCOLS``."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from proxray.common.yamlconfig import StrictModel
from proxray.serve.config import ROUTING_TEXT
from proxray.serve.errors import RequestError, openai_shape
from proxray.serve.request.http import Route  # noqa: F401  (a protocol's extra routes are rows of it)

INT64 = 2**63  # integers in a request must fit a signed 64-bit int (seed, logit_bias, ...)
MAX_MESSAGES = 512
MAX_PARTS = 64
MAX_CONTENT_CHARS = 200_000  # one message's or one prompt's text


class RoutingOptions(StrictModel):
    """Per-request routing options, sent in the body as ``"proxray": {...}`` (the openai client's
    ``extra_body``). Never passed to the model."""

    lam: float | None = Field(None, ge=0, le=1e9, description="λ of acc − λ·cost; default: the app's")
    allowed_models: list[str] | None = Field(None, min_length=1, max_length=256, description="route only among these")
    max_cost: float | None = Field(None, ge=0, description="USD: skip models whose estimated cost is higher")
    explain: bool = Field(False, description="add the evidence behind the choice to the answer's proxray report "
                          "(the 10 nearest training queries or clusters with the most weight, every model's estimate "
                          "and objective, the winner's margin, the outlier score against the router's threshold); "
                          "also the header x-proxray-explain: 1")
    cache: bool | None = Field(None, description="false: not answered from the response cache, nor kept in it")
    conversation: str | None = Field(None, min_length=1, max_length=256, description="a conversation id: its turns "
                                     "keep the model that answered the last one unless another's gain beats the "
                                     "prompt cache a switch gives up (the app's conversations rule); also the header "
                                     "x-proxray-conversation")


class TextPart(BaseModel):
    """``{"type": "text", "text": ...}``; other part types (images, audio) pass through to the model."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(min_length=1, max_length=64)
    text: str | None = Field(None, max_length=MAX_CONTENT_CHARS)

    @model_validator(mode="after")
    def _text_has_text(self):
        if self.type == "text" and self.text is None:
            raise ValueError("a content part of type 'text' needs a 'text' string")
        return self


def text_of(turns: list, policy: str = "system+last_user") -> str:
    """The text the router embeds, a stated function of a conversation as (role, text) pairs (every protocol reads its
    request as such pairs):

    * ``system+last_user``: the system / developer messages, then the last user turn;
    * ``last_user``: the last user turn only;
    * ``all_user``: every user turn, in order;
    * ``all``: every message's text, in order (assistant and tool turns too).

    Nothing the policy excludes reaches the encoder."""
    users = [t for role, t in turns if role == "user" and t.strip()]
    if policy == "last_user":
        parts = users[-1:]
    elif policy == "all_user":
        parts = users
    elif policy == "all":
        parts = [t for _, t in turns if t]
    elif policy == "system+last_user":
        parts = [t for role, t in turns if role in ("system", "developer") and t] + users[-1:]
    else:
        raise ValueError(f"routing_text: unknown policy {policy!r}; one of {ROUTING_TEXT}")
    return "\n".join(parts)


def sse_data(obj: dict) -> str:
    """One server-sent event's ``data:`` line of ``obj``."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


@dataclass(frozen=True)
class Protocol:
    """One client protocol.

    * ``name``: how pool models list it (``PoolModel.protocols``: their endpoints serve it themselves);
    * ``route``: its ``POST`` path; ``request``: the pydantic model of its whole body, validated at the boundary;
    * ``begin(req, ctx)``: the request's ``Turn`` (async);
    * ``upstream``: its path at an endpoint that serves it itself (relative to the endpoint's ``base_url``);
    * ``error(e)``: (status, body) of a ``RequestError`` in its shape; ``events()``: its stream format, an object with
      ``event(obj)``, ``error(body)`` and ``end``;
    * ``has_content(obj)``: whether an object of a stream commits the answer to its model (no fallback after it);
    * ``honoured()``: the parameters an OpenAI-compatible endpoint that serves it takes (refusals are read from it),
      None where the endpoint takes the request as it is;
    * ``routes``: more routes of the protocol (``Route``); ``summary``: what its route does, for the HTTP
      reference (``docs/reference/http.md``); ``mirrors``: the page of the API it mirrors, whose fields it takes."""

    name: str
    route: str
    request: type
    begin: Callable
    upstream: str
    events: Callable
    has_content: Callable[[dict], bool]
    error: Callable[[RequestError], tuple] = openai_shape
    honoured: Callable[[], list] | None = None
    routes: tuple = ()
    summary: str = ""
    mirrors: str = ""


@dataclass
class Context:
    """What a turn is given of the app for one request: the model ``client`` (``stream``, ``refusals``), the
    models whose endpoints serve the protocol themselves (``native``), the app's ``args``, its response ``store``, the
    key's tenancy (``owner``: None for the app's single key) and the request's ``headers``."""

    protocol: Protocol
    client: Any
    native: set
    args: Any
    store: Any = None
    owner: str | None = None
    headers: Any = field(default_factory=dict)


class Turn:
    """What the ingress needs of one request, whatever its protocol (each protocol's turn sets or overrides these):

    * ``protocol``; ``body``: the request every candidate is sent (``model`` rewritten per candidate); ``client``: the
      models as the protocol sees them (``stream(model, upstream, body, patient)``, ``refusals(models, body,
      upstream)``); ``param``: the field the routing text comes from (named in a 413);
    * ``previous``: the model that answered the conversation's last turn, where the request itself names it (a stored
      response's); ``previous_id``: the id that names that conversation; ``session``: a conversation id the client's
      own protocol carries; ``tool_loop``: the request returns tool results to the model that asked for them;
    * ``hide_usage``: the client did not ask for a stream's usage (the gateway always asks the model); ``grown``: its
      body holds more than the request sent (a stored conversation's history), so its token bound is measured again;
    * ``text(policy)``: the routing text; ``usage(obj)``: an answer's or event's usage in chat's words, or None;
      ``answer_id(obj)``: the id the client is given; ``answer(obj, report)``: the whole answer as the client sees it;
      ``shown(head, rest, report)``: a stream's first objects and the rest as the client sees them."""

    previous = previous_id = session = None
    tool_loop = hide_usage = grown = False
    param = "messages"

    def __init__(self, ctx: Context):
        self.protocol, self.ctx = ctx.protocol, ctx

    def sse(self):
        return self.protocol.events()

    def has_content(self, obj: dict) -> bool:
        return self.protocol.has_content(obj)

    @property
    def upstream(self) -> str:
        return self.protocol.upstream

    @staticmethod
    def usage(obj: dict) -> dict | None:
        """The answer's usage as prices read it: with the service tier it reports beside it (OpenAI's
        ``service_tier``: ``priority`` is billed higher)."""
        u, tier = obj.get("usage"), obj.get("service_tier")
        return {**u, "service_tier": tier} if isinstance(u, dict) and isinstance(tier, str) else u

    @staticmethod
    def answer_id(obj: dict) -> str | None:
        return obj.get("id")

    async def answer(self, obj: dict, report: dict) -> dict:
        return {**obj, "proxray": report}

    async def shown(self, head: list, rest, report: dict):
        return [{**head[0], "proxray": report}, *head[1:]], rest
