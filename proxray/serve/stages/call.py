"""The candidates asked in order until one answers (``first_answer``: fallback before the first content)."""
import time

from proxray.serve.request.fallback import first_answer
from proxray.serve.stages.base import Stage
from proxray.serve.wire import BOUND, DEADLINE, REACHED, Reached


class Call(Stage):
    async def before(self, f):
        gw, p = self.gw, f.plan
        t_model = time.perf_counter()
        f.trace.calling()  # its traceparent goes to an endpoint relayed from here
        BOUND.set(f.bound)  # what a relayed endpoint's rate limit books (measured there where the gateway has none)
        DEADLINE.set(f.deadline)  # and how long its limiter may keep the request waiting
        f.reached = Reached()  # marked where the request leaves for a model: a 504 is charged only after that
        REACHED.set(f.reached)
        f.model, f.head, f.gen = await first_answer(f.turn.client, p, f.turn.body, f.turn.upstream, f.req.stream,
                                                    f.deadline, gw.args.timeout_s, gw.failed, f.turn.has_content,
                                                    f.before_fallback)
        f.timings["model_ms"] = 1e3 * (time.perf_counter() - t_model)  # the answer, or a stream's first content
        if f.model != p.candidates[0] or f.estimate is None:  # what it is charged at without usage
            f.estimate = p.report.get("estimates", {}).get(f.model, {}).get("cost", f.estimate)
