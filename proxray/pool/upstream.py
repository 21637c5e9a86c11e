"""What an OpenAI-compatible upstream's answer means, decided here once for the evaluation job's client
(``pool.openai_engine``) and the gateway's relay (``serve.deployments.endpoint_server``) and fallback
(``serve.request.fallback``). Three separate decisions:

* **the same upstream again** (``retry_same``): a 408, 409, 429 or 5xx, a timeout or a refused connection, *before any
  byte of an answer* — after the backoff (the upstream's ``Retry-After``, else exponential with jitter, ``retry_wait``).
  Nothing is tried again once the upstream has answered 200: a connection that breaks after it is an error, not a
  second generation the operator pays for twice.
* **another model** (``falls_back``): what another model can fix — the same passing trouble, once the same upstream's
  tries are spent, or a replica lost. A 400 or 422 (or any other 4xx about the request) goes to the client at once:
  never tried again, never a fallback.
* **the model out of routing** (``takes_model_out``), on the upstream's word, never a client's: a 404 whose error
  object says, in its structured fields, that the model itself is unknown (OpenAI's ``code: model_not_found``,
  Anthropic's ``not_found_error`` about ``model:``). A message is never read for it — an upstream echoes a client's ids
  in its messages ("Item with id 'rs_x-model' not found"), so a client could write it. Any other 404, and any 401 or
  403 (which a client's body can provoke too: a content policy, an item of another organisation), is settled by a
  probe that carries nothing of the client's: the upstream's ``GET /v1/models`` with the gateway's own key — the model
  is taken out where that probe is refused (the gateway's key) or does not list the model (``lists_model``).

``verdict`` puts the three together, a pure function of one failed try (its status, the upstream's error object, the
attempt, the time left): one state machine that the job's loop (``pool.openai_engine``) and the relay's
(``serve.deployments.endpoint_server``) each drive. ``error_object`` is the one reader of an upstream's error body.
"""
from __future__ import annotations

import json
import random
import re

RETRY_SAME = frozenset({408, 409, 429, 500, 502, 503, 504})  # passing trouble: the same request may succeed later
KEY_REFUSED = frozenset({401, 403})


def retry_same(status: int) -> bool:
    """Whether the same upstream is asked again after ``status`` (before any byte of its answer)."""
    return status in RETRY_SAME


def falls_back(status: int) -> bool:
    """Whether another model is tried after a model's ``status`` (its own retries spent)."""
    return status in RETRY_SAME


def model_unknown(status: int, err: dict) -> bool | None:
    """For a 404: True where the upstream's error object says in its structured fields that the model itself is
    unknown, None where it does not (a probe decides); False for any other status."""
    if status != 404:
        return False
    if str(err.get("code") or "").lower() == "model_not_found":  # OpenAI's
        return True
    if err.get("type") == "not_found_error" and str(err.get("message") or "").startswith("model:"):  # Anthropic's
        return True
    return None


def takes_model_out(status: int, err: dict) -> bool | None:
    """Whether ``status`` takes the model out of routing for everyone: True on the upstream's structured word that the
    model is unknown, None for a 401, a 403 or another 404 (a probe with the gateway's own key decides), else False."""
    if status in KEY_REFUSED:
        return None
    return model_unknown(status, err)


def lists_model(listing: dict, name: str) -> bool:
    """Whether an upstream's ``GET /v1/models`` answer lists the model ``name``."""
    return any(isinstance(m, dict) and m.get("id") == name for m in (listing.get("data") or []))


def retry_wait(attempt: int, retry_after: str | None, cap: float = 30.0) -> float:
    """Seconds before retry ``attempt`` (0-based): the endpoint's ``Retry-After`` (seconds) where it gives one, else
    an exponential backoff with jitter, at most ``cap``."""
    if retry_after and retry_after.replace(".", "", 1).isdigit():
        return min(2 * cap, float(retry_after))
    return min(cap, 0.5 * 2 ** attempt) * (0.5 + random.random())


# ---- the state machine of one request to an upstream -----------------------------------------------------------
RETRY = "retry"  # the same upstream again, after the wait
FALL_BACK = "fall_back"  # this upstream is spent for the request: another model may answer (the job: an error row)
REFUSE = "refuse"  # the request's own fault: to the client at once, never tried again anywhere
TAKE_OUT = "take_out"  # the operator's fault (the key refused, the model unknown): the model out of routing
ASK_LISTING = "ask_listing"  # a 401, 403 or 404 a client could have provoked: probe with the gateway's key alone


def verdict(status: int, err: dict, attempt: int, max_retries: int, time_left_s: float | None = None,
            retry_after: str | None = None, answered: bool = False) -> tuple[str, float]:
    """What one failed try means: (``RETRY``, ``FALL_BACK``, ``REFUSE``, ``TAKE_OUT`` or ``ASK_LISTING``, the seconds
    to wait before a retry). ``status``: the upstream's HTTP status (503 for no answer: a timeout, a refused
    connection); ``err``: its error object (``error_object``); ``attempt``: 0-based; ``time_left_s``: until the
    request's deadline (None: none); ``answered``: it had answered 200, then broke off — generated once, never asked
    again."""
    if answered:
        return FALL_BACK, 0.0
    out = takes_model_out(status, err)
    if out is None:
        return ASK_LISTING, 0.0
    if out:
        return TAKE_OUT, 0.0
    if not retry_same(status):
        return REFUSE, 0.0
    wait = retry_wait(attempt, retry_after)
    if attempt >= max_retries or (time_left_s is not None and wait >= time_left_s):
        return FALL_BACK, 0.0
    return RETRY, wait


def error_object(body) -> dict:
    """The error object of an upstream's error body (its text or the parsed JSON): OpenAI's ``{"error": {...}}`` and
    Anthropic's ``{"type": "error", "error": {...}}`` alike; ``{}`` where it has none."""
    if isinstance(body, (str, bytes)):
        try:
            body = json.loads(body)
        except ValueError:
            return {}
    err = body.get("error") if isinstance(body, dict) else None
    return err if isinstance(err, dict) else {}


def refused_parameter(status: int, err: dict) -> str | None:
    """For a 400 whose error object says in its structured fields that the model cannot take one parameter of the
    request (OpenAI's ``code: unsupported_parameter``): that parameter; else None."""
    return (err.get("param") or None) if status == 400 and err.get("code") == "unsupported_parameter" else None


def error_status(err: dict, default: int = 500) -> int:
    """The HTTP status an error object carries in its ``code`` (the gateway's), else ``default``."""
    code = err.get("code")
    if isinstance(code, bool) or not code:
        return default
    if isinstance(code, int):
        return code
    return int(code) if isinstance(code, str) and code.isdigit() else default


def probe_headers(key: str) -> dict:
    """The headers of a probe of an endpoint with the gateway's key and nothing of a client's (``GET /models``): the key
    as ``Authorization: Bearer`` and as ``x-api-key`` (with the ``anthropic-version`` such an endpoint asks for), so
    that an endpoint reading it either way (OpenAI's, Anthropic's) answers the probe."""
    return {"Authorization": f"Bearer {key}", "x-api-key": key, "anthropic-version": "2023-06-01"} if key else {}
