"""The protocol's turn begun: the body every candidate is sent (model aside), in the protocol or as the one internal
request, and its routing text."""
import time

from proxray.serve.stages.base import Stage


class Begin(Stage):
    async def before(self, f):
        gw = self.gw
        gw.client.salt(f.owner[:32] if f.key is not None else "")  # its prompt-cache salt, for models that take one
        f.turn = await f.protocol.begin(f.req, gw.context(f.protocol, f.key, f.request.headers))
        f.timings["parse_ms"] = 1e3 * (time.perf_counter() - f.t0) - f.timings["read_ms"]  # the CPU work after it
        f.text = f.turn.text(gw.args.routing_text)
        if f.turn.grown:  # a stored conversation's history: the turn's body is measured, not the request's
            f.bound = None
