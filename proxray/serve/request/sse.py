"""The stream writer: an answer's events in its protocol's stream format (the protocol's ``events()``: ``event(obj)``,
``error(body)``, ``end``), its usage counted once when it ends, and an error event where the model fails mid-stream."""
from __future__ import annotations

import logging
import time

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


class Pumped:
    """A model's stream read by a task of its own into a queue, so that when the client leaves, what the model still
    sends can be read to its end (``leave``) — for its usage — instead of being cut off: an endpoint whose provider
    bills each answer bills what it generated, and the key is charged that, not its hold. Reading stops at ``until``
    (the request's deadline, ``time.monotonic()``); past it the stream is cancelled and charged as one without usage."""

    END = object()

    def __init__(self, inner, until: float):
        import asyncio

        self.inner, self.until, self.queue = inner, until, asyncio.Queue()
        self.seen = self.then = None
        self.task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self):
        try:
            async for obj in self.inner:
                if self.seen is not None:
                    self.seen(obj)
                else:
                    self.queue.put_nowait(obj)
            self.queue.put_nowait(self.END)
        except Exception as e:  # noqa: BLE001 - handed to the reader, which ends the stream with it
            self.queue.put_nowait(e)
        finally:
            self._finish()

    def _finish(self):
        if self.then is not None:
            then, self.then = self.then, None
            then()

    def __aiter__(self):
        return self

    async def __anext__(self):
        obj = await self.queue.get()
        if obj is self.END:
            raise StopAsyncIteration
        if isinstance(obj, Exception):
            raise obj
        return obj

    def leave(self, seen, then) -> None:
        """The client left: what is queued and what the model still sends go to ``seen``, ``then()`` once it ended
        (or was cancelled at ``until``)."""
        import asyncio

        while not self.queue.empty():
            obj = self.queue.get_nowait()
            if obj is not self.END and not isinstance(obj, Exception):
                seen(obj)
        self.seen, self.then = seen, then
        if self.task.done():
            self._finish()
            return
        PUMPS.add(self.task)
        self.task.add_done_callback(PUMPS.discard)
        delay = max(0.0, self.until - time.monotonic())
        asyncio.get_running_loop().call_later(delay, self.cancel)

    def cancel(self) -> None:
        if self.task.done():
            return
        self.task.cancel()
        if hasattr(self.inner, "cancel"):
            self.inner.cancel()


PUMPS: set = set()  # streams read on after their client left, until they end


async def relay(first: list, rest, fmt, on_done=None, on_chunk=None, hide_usage: bool = False, view=None):
    """The events of a stream whose first chunks (``first``) were already pulled from ``rest``. A failure
    after that ends the stream with an OpenAI-shaped error event (the answer cannot change model any more);
    a client that goes away cancels the model's generation. ``on_done(ok)`` is told how it ended;
    ``on_chunk(obj)`` sees every chunk (e.g. for its usage), also the usage that ``hide_usage`` keeps from the client
    (the gateway asks every model for it; a client that did not ask does not get it); ``view(obj)``: what the client is
    shown of each object after ``on_chunk`` saw it. ``fmt``: the stream's format (its protocol's)."""
    ok = failed = False

    def shown(obj):
        if on_chunk:
            on_chunk(obj)
        if view is not None:
            obj = view(obj)
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
        if not ok and not failed and isinstance(rest, Pumped):  # the client left: the rest read for its usage
            rest.leave(on_chunk or (lambda obj: None), lambda: on_done(True) if on_done else None)
        else:
            if not ok and hasattr(rest, "cancel"):
                rest.cancel()
            if on_done:
                on_done(not failed)  # a client that went away is not a failure


async def answer_stream(turn, head: list, gen, report: dict, counts: list, failed, read_on_until: float | None = None,
                        view=None):
    """The event stream of an answer whose first objects (``head``) were read from ``gen``, as ``turn`` shows it
    (``proxray.serve.protocols.base.Turn``): each of ``counts`` (meter, charger, recorder) is told the
    stream's usage once, when it ends — ``None`` where it ended without (charged its hold) — and ``failed()`` when it
    ended in an error event. ``read_on_until``: a stream its client leaves is read on to its end, up to then
    (``Pumped``: an endpoint whose provider bills what it generated), for the usage it is charged; ``view``: what the
    client is shown of each object (``relay``)."""
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

    if read_on_until is not None:
        gen = Pumped(gen, read_on_until)
    return relay(head, gen, turn.sse(), done, seen, hide_usage=turn.hide_usage, view=view)
