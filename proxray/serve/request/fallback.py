"""Asking the plan's candidates in order until one answers: the whole response, or a stream up to its first
content. Another model is tried after what another model can fix (errors, overload, a dead replica, a timeout);
a model's 4xx about the request itself goes back to the client. No HTTP and no Ray: the client is any object
with ``stream(model, upstream, body, patient)`` giving an async iterator of OpenAI objects with ``cancel()``
(``patient``: the request's last candidate, waited for while it has a live replica, see
``proxray.serve.deployments.liveness``)."""
from __future__ import annotations

import asyncio
import time

from proxray.serve.deployments.client import ModelError, failure_reason
from proxray.serve.deployments.liveness import REPROBE_S, ModelUnavailable, ReplicaLost
from proxray.serve.errors import RequestError, is_error
from proxray.serve.request.plan import Plan, none_honours


async def first_answer(client, p: Plan, body: dict, upstream: str, stream: bool, deadline: float, timeout_s: float,
                       on_failure, has_content, before=None):
    """(model, the objects read so far, the rest of its stream); ``upstream``: the request's path at a model that
    serves its protocol; ``has_content(obj)``: whether a stream's object commits it to its model (the protocol's
    test). ``on_failure(model, reason)`` is told of each
    model that failed (the report's ``failures`` list is kept here); ``await before(model)``, where given, before each
    candidate is asked (it may raise a ``RequestError``: the request ends there). Raises ``RequestError``: the model's own 4xx,
    504 when time ran out, the model's own error where a request that named one model failed with one (a 502, a
    429), 503 when every candidate failed — with Retry-After, naming the model, where the last had no live replica."""
    seen = _Pass()
    while True:
        got = await _one_pass(client, p, body, upstream, stream, deadline, on_failure, has_content, seen, before)
        if got is not None:
            return got
        lost = seen.lost
        left = deadline - time.monotonic()
        if not lost or left <= 0:
            break
        # every candidate lost the replica that had the request, none known down: Serve is replacing them, and the
        # request waits for the first that comes back (within its deadline) instead of failing
        await asyncio.sleep(min(LOST_RETRY_S, left))
    raise _refusal(p, seen, deadline, timeout_s)


LOST_RETRY_S = 0.25  # how soon a request whose every candidate lost its replica asks them again
LOSSES = {"ActorDiedError", "ActorUnavailableError", "RayActorError"}


class _Pass:
    """What a pass over the candidates learnt: the last model error, the last "no replica" error, and whether every
    failure of the pass was a lost replica."""

    def __init__(self):
        self.last = self.unavailable = None
        self.lost = True
        self.again = False  # the model just asked lost the replica that had the request


def _lost(e: BaseException) -> bool:
    """Whether ``e`` says the replica that had the request died and Ray said so (its actor errors: Serve replaces it),
    not that the model has no replica to come (``ModelUnavailable``), went silent (``ReplicaLost``: its node may be
    gone) or refused the request."""
    return any(c.__name__ in LOSSES for c in type(e).__mro__)


async def _one_pass(client, p: Plan, body, upstream, stream, deadline, on_failure, has_content, seen: _Pass,
                    before=None):
    """One try of every candidate in order: (model, head, gen), or None (what failed told in ``seen``)."""
    seen.lost = True
    for model in _with_retries(p.candidates, seen):
        if before is not None:
            await before(model)
        gen = client.stream(model, upstream, {**body, "model": model}, model == p.candidates[-1])
        head = []
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise asyncio.TimeoutError
                obj = await asyncio.wait_for(gen.__anext__(), left)
                if is_error(obj):
                    raise ModelError(obj)
                head.append(obj)
                if not stream or has_content(obj):
                    break
        except StopAsyncIteration:
            pass  # a stream that ended before any content: complete as it is
        except ModelError as e:
            gen.cancel()
            if e.unsupported and p.report.get("routed"):  # its capabilities did not say so in time: the next is asked
                p.report.setdefault("excluded", {}).setdefault(model, []).append(e.unsupported)
                seen.lost = False
                continue
            if not e.falls_back:
                raise _as_request_error(e) from None
            seen.last, seen.lost = e, False
            _failed(p, model, str(e), on_failure)
            continue
        except Exception as e:  # noqa: BLE001 - replica died, overloaded, timed out: try the next
            gen.cancel()
            seen.unavailable = e if isinstance(e, (ModelUnavailable, ReplicaLost)) else None
            seen.again = _lost(e)  # the replica that had it died: the model's other replicas are asked first
            seen.lost = seen.lost and seen.again
            _failed(p, model, failure_reason(e), on_failure)
            if time.monotonic() >= deadline:
                seen.lost = False
                return None
            continue
        if not head:
            _failed(p, model, "the model returned nothing", on_failure)
            seen.lost = False
            continue
        answered_by(p, model)
        return model, head, gen
    return None


def answered_by(p: Plan, model: str) -> None:
    """The plan's report once ``model`` answered (a model asked, or the response cache's answer of it)."""
    p.report.update({"model": model, "fallback_from": list(dict.fromkeys(  # each model once, asked again or not
        f["model"] for f in p.report.get("failures", [])))})
    p.report.setdefault("failures", [])
    if p.report.get("routed"):
        p.report["estimated_accuracy"] = p.report["estimates"][model]["accuracy"]
        p.report["estimated_cost"] = p.report["estimates"][model]["cost"]


def _with_retries(candidates: list, seen: _Pass):
    """The candidates in order, a model whose replica died with the request (``seen.again``, set by the caller)
    asked once more right away: Serve's router has dropped the dead replica, so the turn goes to one of the model's
    others (a conversation's, the next on its ring, whose cache it loses but not its model); with none left, the
    call is not taken within ``failover_s`` and the next candidate is asked."""
    for model in candidates:
        seen.again = False
        yield model
        if seen.again:
            seen.again = False
            yield model


def _refusal(p: Plan, seen: _Pass, deadline: float, timeout_s: float) -> RequestError:
    """The error of a request no candidate answered."""
    last, unavailable = seen.last, seen.unavailable
    failures = p.report.get("failures", [])
    excluded = p.report.get("excluded", {})
    if not failures and all(m in excluded for m in p.candidates):  # each refused a parameter of the request
        return none_honours(excluded)
    if failures and all(f["error"] == "timeout" for f in failures) or time.monotonic() >= deadline:
        return RequestError(504, f"no answer within timeout_s={timeout_s} s (tried "
                           f"{', '.join(f['model'] for f in failures)})", kind="timeout")
    retry = {"retry-after": str(max(1, round(REPROBE_S)))} if unavailable else None
    if len(p.candidates) == 1 and unavailable is not None:  # a named model none of whose replicas answers
        return RequestError(503, f"{unavailable}; retry after {retry['retry-after']} s", "model",
                           "service_unavailable", headers=retry)
    if len(p.candidates) == 1 and last is not None:  # a named model's own answer says more than "every one failed"
        return _as_request_error(last)
    return RequestError(503, f"every candidate model failed: {failures}", kind="service_unavailable", headers=retry)


def _as_request_error(e: ModelError) -> RequestError:
    err = e.obj["error"]
    return RequestError(e.status, err.get("message", ""), err.get("param"), err.get("type") or "invalid_request_error")


def _failed(p: Plan, model: str, reason: str, on_failure) -> None:
    p.report.setdefault("failures", []).append({"model": model, "error": reason})
    on_failure(model, reason)
