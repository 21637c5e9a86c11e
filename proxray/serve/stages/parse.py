"""The request read: its key identified, its body read, bounded and validated as its protocol's request, its alias
resolved, its routing policy decided and the key's 403s applied (``Gateway.open``)."""
from proxray.serve.config import ROUTER_MODEL
from proxray.serve.protocols.core import output_limit
from proxray.serve.stages.base import Stage


class Parse(Stage):
    async def before(self, f):
        f.key, f.req, f.rp = await self.gw.open(f.request, f.protocol.request, f.timings)
        f.owner = f.key and f.key.owner
        f.routed = f.req.model == ROUTER_MODEL
        f.trace.requested(f.req.model, output_limit(f.req))
