"""The one builder of OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status
as ``code``, for every error the gateway answers or relays (a refused request, a model's refusal, a stream that
fails mid-way), and ``RequestError``, the exception that carries one to the HTTP boundary."""
from __future__ import annotations


def error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    """An OpenAI error object; ``code`` is the HTTP status."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


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
