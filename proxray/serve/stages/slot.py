"""The key's requests in flight on this replica (``max_concurrent``): a place taken before any work on the request,
given back when its answer ends or it fails."""
from proxray.serve.stages.base import Stage


class Slot(Stage):
    async def before(self, f):
        f.slot = self.gw.gate.enter(f.key)

    def failed(self, f, error):
        if f.slot is not None:
            f.slot.release()

    def answered(self, f):
        return f.slot.release
