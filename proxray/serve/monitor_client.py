"""The ingress's link to the drift monitor (``proxray.monitor``): reports routed traffic fire-and-forget
and watches for a newer router artifact, which it loads off the event loop and hands to ``on_router``.

The monitor is optional and may start after the app, restart, or be stopped: it is looked up lazily,
by name, and looked up again (at most every ``retry_s``) after it was missing or a call failed; until
then reports are dropped (counted) and serving goes on with the router it has.
"""
from __future__ import annotations

import asyncio
import logging

from proxray.common.actors import ActorDown
from proxray.common.shared_actor import SharedActorClient

logger = logging.getLogger("ray.serve")


class MonitorClient(SharedActorClient):
    """The monitor actor named ``name``, only looked up (``SharedActorClient`` with ``creates = False``)."""

    creates = False

    def __init__(self, name: str, reload_every_s: float, router_path: str, encoder_id: str, on_router,
                 retry_s: float = 2.0):
        super().__init__("", name=name)
        self.reload_every_s, self.router_path, self.encoder_id = reload_every_s, router_path, encoder_id
        self.on_router, self.retry_s = on_router, retry_s
        self.dropped = self.reported = 0  # reports dropped (the monitor not there) and reports made in all
        self._watcher = None

    def report(self, text: str, x, outlier: float) -> None:
        """Fire and forget: the request never waits for the monitor."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        self.reported += 1
        if not self.send("report", text, x, outlier):
            self.dropped += 1

    def feedback(self, text: str, model: str, score: float, cost: float | None, comment: str | None = None,
                 source: str | None = None) -> bool:
        """A user's score of ``model``'s answer to ``text`` from key ``source`` (its name in the keys file), fire and
        forget; False where the monitor is not there."""
        return self.send("feedback", text, model, score, cost, comment, source)

    async def _watch(self):
        """Switch to the monitor's newest router artifact: load it off the event loop, then hand it over in
        one call, so requests in flight finish on the old router and none is dropped."""
        from proxray.routing.registry import load_router

        while True:
            await asyncio.sleep(self.reload_every_s)
            try:
                path = await self.call("current_router", timeout_s=30.0)
            except ActorDown as e:  # the monitor is optional; serving goes on
                if e.why != "not running":
                    logger.warning("proxray: monitor %r unavailable (%s); serving goes on", self.name, e.why)
                continue
            if path == self.router_path:
                continue
            try:
                new = await asyncio.to_thread(load_router, path, None, self.encoder_id)
            except Exception as e:  # noqa: BLE001 - a bad artifact: keep serving the old router
                logger.warning("proxray: cannot load router %s: %s", path, e)
                continue
            self.router_path = path
            self.on_router(new, path)
            logger.info("proxray: switched to router %s (%d training queries)", path, new.n_train_)
