"""Memory a piece of work needs against what the machine has, checked before the work starts.

``available_bytes()`` is what this process may still take: the kernel's ``MemAvailable``, capped by the cgroup's
limit less its usage where one is set (a container or a Ray worker's cgroup). ``check_memory`` turns an estimate
that does not fit into an error that names the work, the estimate, what is available and what to do instead,
so a table too large for the machine fails in a second rather than being killed by the kernel an hour in.
"""
from __future__ import annotations

import os
from pathlib import Path

HEADROOM = 0.8  # the share of available memory a piece of work may plan to use


class TooLargeError(ValueError):
    """The work would not fit in this machine's memory."""


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_bytes() -> int | None:
    """Bytes this process may still allocate (None where the platform does not say)."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    if avail is None and hasattr(os, "sysconf"):
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            avail = None
    cg = Path("/sys/fs/cgroup")
    limit, used = _read_int(cg / "memory.max"), _read_int(cg / "memory.current")
    if limit is not None and used is not None:
        avail = limit - used if avail is None else min(avail, limit - used)
    return avail


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_memory(need: int, what: str, fix: str, available: int | None = None) -> None:
    """Raise ``TooLargeError`` when ``need`` bytes exceed ``HEADROOM`` of the memory available."""
    available = available_bytes() if available is None else available
    if available is None or need <= HEADROOM * available:
        return
    raise TooLargeError(f"{what} needs about {gib(need)} of memory; this machine has {gib(available)} available "
                        f"(at most {HEADROOM:.0%} of it is planned for): {fix}")
