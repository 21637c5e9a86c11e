"""What travels between the gateway's rooms beside a body: the paths of the internal request (the forms every
co-hosted engine answers: OpenAI chat completions and completions), and the headers a protocol asks the relay to send
an endpoint that serves it itself (``UpstreamHeaders``), the fields a body names its output limit in
(``LIMIT_FIELDS``), and a body's token bound, measured once (``measure``) and carried to the relay's rate limiter
(``BOUND``) with the request's deadline (``DEADLINE``), and whether the request reached a model (``REACHED``); and
the ids of the objects the gateway makes (``new_id``)."""
from __future__ import annotations

import contextvars
import json
import uuid

from proxray.common.pricing import TokenBound, hosted_tools, writes_cache

CHAT_PATH = "/chat/completions"  # the internal request: the chat form every model takes
COMPLETIONS_PATH = "/completions"
# a token count (Messages' count_tokens) generates nothing, and providers limit counts apart from their token limits:
# the relay books nothing of its endpoint's rate limit for one
COUNT_PATH = "/messages/count_tokens"
LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")  # a body's output limit, in any protocol
COUNTS = ("n", "best_of")  # answers a request asks for: its bound is its limit times the larger
MAX_TOOL_USES = 10_000  # a hosted tool's ``max_uses`` above this bounds nothing

# the request's ``TokenBound`` where the gateway measured it: the relay's rate limiter books it (in the ingress's
# process, as the trace headers are), instead of measuring the body again
BOUND: contextvars.ContextVar = contextvars.ContextVar("proxray_bound", default=None)
# the request's own deadline (``time.monotonic()``) where the gateway has one: the relay's rate limiter waits no longer
DEADLINE: contextvars.ContextVar = contextvars.ContextVar("proxray_deadline", default=None)
# the request's ``Reached`` where the gateway follows it: marked where the request leaves for a model
REACHED: contextvars.ContextVar = contextvars.ContextVar("proxray_reached", default=None)
measured = 0  # bodies measured in this process (``Gateway.counts``)


def new_id(prefix: str, sep: str = "_") -> str:
    """A fresh id of an object the gateway makes (``resp_…``, ``msg_…``, ``fc_…``, ``toolu_…``; ``chatcmpl-…``
    with ``sep="-"``)."""
    return f"{prefix}{sep}{uuid.uuid4().hex[:24]}"


class Reached:
    """Whether a request reached a model, so whether a model may have billed it: a co-hosted deployment once it was
    called, a relayed endpoint once the request's headers began to go out to it (not while it waited for the
    endpoint's rate limit, a slot or a connection)."""
    __slots__ = ("model",)

    def __init__(self):
        self.model = None  # the model that has it, the last one asked


def reached(model: str) -> None:
    """The request (``REACHED``) reached ``model``: from here on the model may bill it."""
    if (r := REACHED.get()) is not None:
        r.model = model


def reached_on_send(model: str):
    """httpx's ``trace`` extension for a call relayed to ``model``: the request reached its endpoint once its headers
    go out."""
    async def trace(event: str, _info) -> None:
        if event.endswith(".send_request_headers.started"):
            reached(model)

    return trace


def measure(body: dict) -> TokenBound:
    """``body``'s ``TokenBound``: its JSON serialised once (compact) for its prompt, its one output limit (whichever
    of ``LIMIT_FIELDS`` it sends) times its answers (the larger of ``COUNTS``), its cache writes and hosted tools, the
    service tier it asks and whether it asks for audio."""
    global measured
    measured += 1
    chars = len(json.dumps(body, separators=(",", ":")))
    limit = next((v for v in (body.get(f) for f in LIMIT_FIELDS) if isinstance(v, int) and not isinstance(v, bool)
                  and v > 0), 0)
    answers = max(int(body.get("n") or 1), int(body.get("best_of") or 1))
    hosted = tuple(hosted_tools(body))
    uses = [body["tools"][i].get("max_uses") for i, _ in hosted]  # where the request bounds them
    calls = sum(u for u in uses if isinstance(u, int) and not isinstance(u, bool) and 0 < u <= MAX_TOOL_USES)
    tier = body.get("service_tier") if isinstance(body.get("service_tier"), str) else ""
    modalities = body.get("modalities")
    audio = isinstance(modalities, list) and "audio" in modalities or body.get("audio") is not None
    return TokenBound(chars // 3, limit * answers, writes_cache(body), hosted, calls, chars, limit, tier, audio)


class UpstreamHeaders(dict):
    """Headers a protocol's turn asks the relay to send with a request (``proxray.serve.deployments.endpoint_server``),
    carried in the body under ``FIELD``, and the header that also carries the endpoint's key (``key_header``). Only an
    object of this class is honoured there, which no client's JSON can be: a client's own ``FIELD`` is dropped."""

    FIELD = "__proxray_upstream__"

    def __init__(self, headers: dict, key_header: str | None = None, for_price=None):
        super().__init__(headers)
        self.key_header = key_header
        self.for_price = for_price  # (headers, the model's price) -> what that model is sent, where the protocol says

    def sent_to(self, price) -> dict:
        """The headers a model at ``price`` (its ``PriceSpec``, or None) is sent."""
        headers = {k: str(v) for k, v in self.items()}
        return self.for_price(headers, price) if self.for_price is not None else headers

