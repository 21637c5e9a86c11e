"""Deterministic pseudo-random numbers from content: the same parts give the same number in every process,
on every node and after every retry (no RNG state to carry)."""
from __future__ import annotations

import hashlib


def unit_hash(*parts) -> float:
    """A uniform number in [0, 1) from ``parts`` (their ``str``, joined): stable across processes and retries."""
    h = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64
