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
* **the model out of routing** (``takes_model_out``): a 401 or 403 (the upstream refused the gateway's key), or a 404
  that says the model itself is unknown (``model_not_found``, "the model ... does not exist") — not a 404 about
  something the request refers to (an item, a stored response), which any client can provoke. A 404 that says neither
  is settled by asking the upstream's ``/v1/models`` (``lists_model``).
"""
from __future__ import annotations

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
    """For a 404: True where the upstream's error says the model itself is unknown, None where it does not say
    (``lists_model`` decides); False for any other status."""
    if status != 404:
        return False
    if str(err.get("code") or "").lower() == "model_not_found" or \
            re.search(r"\bmodel\b.*\b(does not exist|not found)\b", str(err.get("message") or ""), re.I | re.S):
        return True
    return None


def takes_model_out(status: int, err: dict) -> bool | None:
    """Whether ``status`` takes the model out of routing for everyone (None: a 404 to settle with ``lists_model``)."""
    return True if status in KEY_REFUSED else model_unknown(status, err)


def lists_model(listing: dict, name: str) -> bool:
    """Whether an upstream's ``GET /v1/models`` answer lists the model ``name``."""
    return any(isinstance(m, dict) and m.get("id") == name for m in (listing.get("data") or []))


def retry_wait(attempt: int, retry_after: str | None, cap: float = 30.0) -> float:
    """Seconds before retry ``attempt`` (0-based): the endpoint's ``Retry-After`` (seconds) where it gives one, else
    an exponential backoff with jitter, at most ``cap``."""
    if retry_after and retry_after.replace(".", "", 1).isdigit():
        return min(2 * cap, float(retry_after))
    return min(cap, 0.5 * 2 ** attempt) * (0.5 + random.random())
