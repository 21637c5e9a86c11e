"""One bounded mapping, least recently used out first: what the serving path keeps in memory (conversations,
embeddings) without growing."""
from __future__ import annotations

from collections import OrderedDict


class LRU:
    """At most ``capacity`` entries (0: none kept). ``get`` refreshes an entry; ``put`` adds or refreshes one and drops
    the least recently used past the bound, counted in ``dropped``."""

    def __init__(self, capacity: int, on_drop=None):
        if capacity < 0:
            raise ValueError(f"capacity={capacity}: must be >= 0 (0 = nothing kept)")
        self.capacity, self.dropped = capacity, 0
        self.on_drop = on_drop  # called with each key the bound drops
        self._d: OrderedDict = OrderedDict()

    def get(self, key, default=None):
        if key not in self._d:
            return default
        self._d.move_to_end(key)
        return self._d[key]

    def put(self, key, value) -> None:
        if not self.capacity:
            return
        self._d[key] = value
        self._d.move_to_end(key)
        self._trim()

    def pop(self, key, default=None):
        return self._d.pop(key, default)

    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        self._trim()

    def _trim(self) -> None:
        while len(self._d) > self.capacity:
            key, _ = self._d.popitem(last=False)
            self.dropped += 1
            if self.on_drop is not None:
                self.on_drop(key)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key) -> bool:
        return key in self._d

    def __iter__(self):
        return iter(self._d)
