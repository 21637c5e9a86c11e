"""The monitor's clock: ``tick`` every ``every_s`` in a background thread until stopped. One failed round (the
Jobs API down) is logged and the next goes on."""
from __future__ import annotations

import logging
import threading

logger = logging.getLogger("proxray.monitor")


class Scheduler:
    def __init__(self, tick, every_s: float):
        self.tick, self.every_s = tick, every_s
        self._stop = threading.Event()
        self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.alive:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="proxray-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - one bad tick must not end the loop
                logger.exception("proxray monitor: tick failed")
            self._stop.wait(self.every_s)
