"""The one builder of OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status
as ``code``, for every error the gateway answers or relays (a refused request, a model's refusal, a stream that
fails mid-way), and ``RequestError``, the exception that carries one to the HTTP boundary."""
from __future__ import annotations


def error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
          unsupported: bool = False) -> dict:
    """An OpenAI error object; ``code`` is the HTTP status. ``unsupported``: a model's refusal of ``param``, a
    parameter of the request it cannot take (a routed request asks the next model instead)."""
    err = {"message": message, "type": kind, "param": param, "code": status}
    return {"error": {**err, "unsupported": True} if unsupported else err}


def is_error(obj: dict) -> bool:
    """An error object (a response object's ``"error": null`` is not one)."""
    return isinstance(obj.get("error"), dict)


class RequestError(Exception):
    """A request the gateway refuses: HTTP status, a message naming the problem, the parameter."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}  # e.g. retry-after on a 429

    def body(self) -> dict:
        return error(self.status, self.message, self.param, self.kind)


def validation_message(err) -> tuple[str, str | None]:
    """A pydantic ``ValidationError`` as (message naming every field at fault, up to five; the first field's path)."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or None
    msgs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in err.errors()[:5])
    return msgs, loc


def openai_shape(e: RequestError) -> tuple[int, dict]:
    """(status, body) of ``e`` as OpenAI answers errors: what every route answers unless its protocol has a shape of
    its own (``proxray.serve.protocols.base.Protocol.error``)."""
    return e.status, e.body()


# every status the gateway answers with, and when (docs/reference/http.md is written from it; a test finds each
# status the code raises here)
STATUSES: dict[int, str] = {
    400: "the body or a field is invalid (the message names the field: `param`), a parameter no routable model honours, "
         "two output limits at once, a hosted tool without a price for a budgeted key",
    401: "no API key, or not a key of the app (`Authorization: Bearer …`, or `x-api-key` on the Messages routes)",
    403: "the key may not use that model, alias or route option (its `models`, `lam`, `allowed_models`)",
    404: "no such model (the message lists the served ones), path, stored response, or feedback answer id",
    405: "a method the path does not serve",
    408: "the request outlived the HTTP proxy's `request_timeout_s` (Serve's proxy answers it)",
    413: "the body is over `max_body_bytes`, or the routing text over `max_prompt_chars` (`param` names the field)",
    429: "the key's rate (`retry-after` header) or budget (`insufficient_quota`), or an endpoint's limit the gateway "
         "holds for it, spent",
    502: "the model's endpoint failed the request (a request naming one model gets its error), or a stream failed "
         "after its first content",
    503: "no replica of the model answers (its node lost, its deployment down), a shared actor (the keys ledger) "
         "is restarting, or the app is starting; Anthropic's shape answers it as 529 `overloaded_error`",
    504: "no model answered within `timeout_s`",
}
