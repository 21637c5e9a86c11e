"""The stream writer: an answer's events in its protocol's stream format (the protocol's ``events()``: ``event(obj)``,
``error(body)``, ``end``), its usage counted once when it ends, and an error event where the model fails mid-stream."""
from __future__ import annotations

import logging

from proxray.serve.deployments.client import ModelError, failure_reason
from proxray.serve.errors import error, is_error

logger = logging.getLogger("ray.serve")


def without_usage(obj: dict) -> dict | None:
    """A chunk as a client that did not ask for usage gets it: no ``usage`` field, no usage-only chunk."""
    if "usage" not in obj:
        return obj
    if not obj.get("choices"):
        return None
    return {k: v for k, v in obj.items() if k != "usage"}


async def relay(first: list, rest, fmt, on_done=None, on_chunk=None, hide_usage: bool = False):
    """The events of a stream whose first chunks (``first``) were already pulled from ``rest``. A failure
    after that ends the stream with an OpenAI-shaped error event (the answer cannot change model any more);
    a client that goes away cancels the model's generation. ``on_done(ok)`` is told how it ended;
    ``on_chunk(obj)`` sees every chunk (e.g. for its usage), also the usage that ``hide_usage`` keeps from the client
    (the gateway asks every model for it; a client that did not ask does not get it). ``fmt``: the stream's format
    (its protocol's)."""
    ok = failed = False

    def shown(obj):
        if on_chunk:
            on_chunk(obj)
        return without_usage(obj) if hide_usage else obj

    try:
        for obj in first:
            if (obj := shown(obj)) is not None:
                yield fmt.event(obj)
        async for obj in rest:
            if is_error(obj):
                raise ModelError(obj)
            if (obj := shown(obj)) is not None:
                yield fmt.event(obj)
        ok = True
        if fmt.end:
            yield fmt.end
    except Exception as e:  # noqa: BLE001 - reported to the client as an error event
        failed = True
        logger.warning("proxray: stream failed after its first chunk: %s", e)
        body = e.obj if isinstance(e, ModelError) else error(
            502, f"the model failed mid-stream ({failure_reason(e)})", kind="server_error")
        yield fmt.error(body)
    finally:
        if not ok and hasattr(rest, "cancel"):
            rest.cancel()
        if on_done:
            on_done(not failed)  # a client that went away is not a failure


async def answer_stream(turn, head: list, gen, report: dict, counts: list, failed):
    """The event stream of an answer whose first objects (``head``) were read from ``gen``, as ``turn`` shows it
    (``proxray.serve.protocols.base.Turn``): each of ``counts`` (meter, charger, recorder) is told the
    stream's usage once, when it ends — ``None`` where it ended without (charged its hold) — and ``failed()`` when it
    ended in an error event."""
    try:
        head, gen = await turn.shown(head, gen, report)
    except BaseException:  # answered, not delivered: charged as an answer without usage
        gen.cancel()
        for count in counts:
            count(None)
        raise
    usage = {}  # the stream's usage, from its last chunk (asked of every model)

    def seen(obj):
        if found := turn.usage(obj):
            usage["usage"] = found

    def done(ok):
        if not ok:  # a stream that ended in an error event
            failed()
        for count in counts:
            count(usage.get("usage"))

    return relay(head, gen, turn.sse(), done, seen, hide_usage=turn.hide_usage)
