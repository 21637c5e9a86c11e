"""The plan: a named model's, or the router's decision over the routing text (``Gateway.plan``)."""
from proxray.serve.stages.base import Stage


class Plan(Stage):
    async def before(self, f):
        f.plan = await self.gw.plan(f.req, f.rp, f.turn, f.timings, f.text, f.key, facts=f.facts)
        f.trace.routed(f.plan.report, f.plan.candidates[0] if f.plan.candidates else None)
