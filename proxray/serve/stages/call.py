"""The candidates asked in order until one answers (``first_answer``: fallback before the first content). A keyed
whole answer whose client left once a relayed endpoint had the request is read on to its end and charged what the
endpoint billed, as a stream left early is."""
import asyncio
import time

from proxray.serve.errors import RequestError
from proxray.serve.request.fallback import first_answer
from proxray.serve.stages.base import Stage
from proxray.serve.wire import BOUND, DEADLINE, REACHED, Reached

_reading: set = set()  # the answers read on after their clients left (a reference each until settled)


class Call(Stage):
    async def before(self, f):
        if f.head is not None:  # answered from the response cache (``stages.cache``)
            return
        gw, p = self.gw, f.plan
        t_model = time.perf_counter()
        f.trace.calling()  # its traceparent goes to an endpoint relayed from here
        BOUND.set(f.bound)  # what a relayed endpoint's rate limit books (measured there where the gateway has none)
        DEADLINE.set(f.deadline)  # and how long its limiter may keep the request waiting
        f.reached = Reached()  # marked where the request leaves for a model: a 504 is charged only after that
        REACHED.set(f.reached)
        asked = asyncio.ensure_future(first_answer(f.turn.client, p, f.turn.body, f.turn.upstream, f.req.stream,
                                                   f.deadline, gw.args.timeout_s, gw.failed, f.turn.has_content,
                                                   f.before_fallback))
        try:
            f.model, f.head, f.gen = await asyncio.shield(asked)
        except asyncio.CancelledError:  # the client left
            if not self._read_on(f, asked):
                asked.cancel()
            raise
        f.timings["model_ms"] = 1e3 * (time.perf_counter() - t_model)  # the answer, or a stream's first content
        if f.model != p.candidates[0] or f.estimate is None:  # what it is charged at without usage
            f.estimate = _estimate(f, f.model)

    def _read_on(self, f, asked) -> bool:
        """Whether the answer ``asked`` is read on after its client left, to charge its key what the endpoint billed:
        a keyed whole answer (a stream's end is read on where it is answered) once a relayed endpoint has it."""
        model = f.reached.model if f.reached is not None else None
        if f.req.stream or f.held is None or not f.held.open or not model or not self.gw.client.relayed(model):
            return False
        f.read_on = True  # the hold is settled when the answer ends, not released now
        task = asyncio.ensure_future(_settle(f, asked))
        _reading.add(task)
        task.add_done_callback(_reading.discard)
        return True


async def _settle(f, asked) -> None:
    """The key of a request whose client left charged once its answer ends: its usage, or a refusal's charge."""
    try:
        model, head, _ = await asked
    except RequestError as e:
        f.held.refused(e.status, f.plan, f.bound, reached=True)
        return
    except BaseException:  # noqa: BLE001 - nothing answered: nothing spent
        f.held.release()
        return
    charge = f.held.charger(model, _estimate(f, model), f.bound, shared_cache=True)  # a relayed endpoint's cache is every key's
    if charge is not None:
        charge(f.turn.usage(head[0]) if head else None)


def _estimate(f, model: str) -> float | None:
    """What ``model``'s answer to ``f`` is charged at without usage: the plan's estimate of it, else the request's."""
    cost = f.plan.cost_of(model)
    return cost if cost is not None else f.estimate
