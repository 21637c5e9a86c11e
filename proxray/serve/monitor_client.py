"""The ingress's link to the drift monitor (``proxray.monitor``): reports routed traffic fire-and-forget
and watches for a newer router artifact, which it loads off the event loop and hands to ``on_router``."""
from __future__ import annotations

import asyncio
import logging
import uuid

logger = logging.getLogger("ray.serve")


class MonitorClient:
    def __init__(self, name: str, reload_every_s: float, router_path: str, encoder_id: str, on_router):
        import ray

        self.actor = ray.get_actor(name, namespace="proxray")
        self.reload_every_s, self.router_path, self.encoder_id = reload_every_s, router_path, encoder_id
        self.on_router = on_router
        self._watcher = None

    def report(self, text: str, x, utility, chosen: int, outlier: float) -> None:
        """Fire and forget: the request never waits for the monitor."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        self.actor.report.remote(uuid.uuid4().hex, text, x, list(map(float, utility)), chosen, outlier)

    async def _watch(self):
        """Switch to the monitor's newest router artifact: load it off the event loop, then hand it over in
        one call, so requests in flight finish on the old router and none is dropped."""
        from ..artifact import load_router

        while True:
            await asyncio.sleep(self.reload_every_s)
            try:
                path = (await self.actor.status.remote())["router_path"]
                if path != self.router_path:
                    new = await asyncio.to_thread(load_router, path, None, self.encoder_id)
                    self.router_path = path
                    self.on_router(new, path)
                    logger.info("proxray: switched to router %s (%d training queries)", path, new.n_train_)
            except Exception as e:  # noqa: BLE001 - the monitor is optional; serving goes on
                logger.warning("proxray: router watch failed: %s", e)
