"""One progress display for a job of several parts (the evaluation job's models): rows done / total per
part, rows/s and ETA. On a terminal it redraws one block in place; otherwise (logs, CI, a Ray job's
driver log) it writes plain lines, at most one per part every ``every_s`` seconds plus each part's last."""
from __future__ import annotations

import sys
import time

from proxray.common.logs import log


def _eta(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    def __init__(self, totals: dict, stream=None, tty: bool | None = None, every_s: float = 10.0):
        self.totals = dict(totals)
        self.done = {k: 0 for k in totals}
        self.errors = {k: 0 for k in totals}
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every_s = every_s
        self.t0 = time.time()
        self._last_line = {k: 0.0 for k in totals}
        self._drawn = 0

    def line(self, key) -> str:
        done, total = self.done[key], self.totals[key]
        rate = done / max(time.time() - self.t0, 1e-9)
        eta = "done" if done >= total else f"ETA {_eta((total - done) / rate) if rate > 0 else '?'}"
        err = f" ({self.errors[key]} errors)" if self.errors[key] else ""
        return f"{key}: {done}/{total} rows{err}, {rate:.1f} rows/s, {eta}"

    def total_line(self) -> str:
        done, total = sum(self.done.values()), sum(self.totals.values())
        rate = done / max(time.time() - self.t0, 1e-9)
        eta = "done" if done >= total else f"ETA {_eta((total - done) / rate) if rate > 0 else '?'}"
        return f"all {len(self.totals)} models: {done}/{total} rows, {rate:.1f} rows/s, {eta}"

    def update(self, key, rows: int, errors: int = 0) -> None:
        self.done[key] += rows + errors
        self.errors[key] += errors
        if self.tty:
            self._draw()
            return
        now = time.time()
        if now - self._last_line[key] >= self.every_s or self.done[key] >= self.totals[key]:
            self._last_line[key] = now
            log(self.line(key) + " | " + self.total_line())

    def _draw(self) -> None:
        lines = [self.line(k) for k in self.totals] + [self.total_line()]
        up = f"\x1b[{self._drawn}F" if self._drawn else ""
        self.stream.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
        self.stream.flush()
        self._drawn = len(lines)
