"""What the monitor knows of routed traffic: the recent window, the queues of queries waiting to be evaluated
(drifted ones, and a ``shadow_rate`` sample for true J_z), the keys already evaluated (never queued twice),
counters and a bounded list of events. Every report is applied here, live and when the journal is replayed."""
from __future__ import annotations

import time
from collections import OrderedDict, deque

from proxray.monitor.detector import group_name


class TrafficBook:
    def __init__(self, window: int, max_buffer: int):
        self.max_buffer = max_buffer
        self.seq = 0
        self.window = deque(maxlen=window)
        self.drift_queue: OrderedDict = OrderedDict()  # key -> {"prompt", "group", "reason"}
        self.shadow_queue: OrderedDict = OrderedDict()  # key -> {"prompt", "group", "outlier", "t"}
        self.seen: set = set()  # keys re-evaluated (or in flight): never queued twice
        self.shadow_seen: set = set()  # keys shadow-evaluated (or in flight)
        self.stats = {"reported": 0, "drifted": 0, "shadowed": 0, "dropped_full": 0, "repeats": 0}
        self.events: list = []  # first detection, submissions, absorptions (bounded)

    def apply(self, e: dict) -> None:
        """A report's effect: ``e`` = {"seq", "t", "key", "prompt", "group", "drifted", "score", "shadow"}."""
        self.seq = e["seq"]
        self.stats["reported"] += 1
        name = group_name(e["group"], e["drifted"])
        self.window.append({"key": e["key"], "prompt": e["prompt"], "group": name, "drifted": e["drifted"],
                            "score": e["score"]})
        if e["drifted"]:
            self.stats["drifted"] += 1
            if not any(ev["event"] == "first_drift" for ev in self.events):
                self.event("first_drift", reported=self.stats["reported"])
            self.enqueue(e["key"], {"prompt": e["prompt"], "group": name, "reason": "outlier"})
        if e["shadow"] and e["key"] not in self.shadow_seen and e["key"] not in self.shadow_queue:
            if len(self.shadow_queue) < self.max_buffer:
                self.shadow_queue[e["key"]] = {"prompt": e["prompt"], "group": name, "outlier": e["drifted"], "t": e["t"]}
                self.stats["shadowed"] += 1
            else:
                self.stats["dropped_full"] += 1

    def enqueue(self, key: str, item: dict) -> None:
        """Queue a query for re-evaluation, once."""
        if key in self.drift_queue or key in self.seen:
            self.stats["repeats"] += 1
        elif len(self.drift_queue) >= self.max_buffer:
            self.stats["dropped_full"] += 1
        else:
            self.drift_queue[key] = item

    def queue_group(self, group: str) -> int:
        """Queue the window's queries of ``group`` not evaluated yet (a J_z trigger); returns how many."""
        n = 0
        for w in self.window:
            if w["group"] == group and w["key"] not in self.drift_queue and w["key"] not in self.seen:
                self.enqueue(w["key"], {"prompt": w["prompt"], "group": group, "reason": "overlap"})
                n += 1
        return n

    def take(self, kind: str, size: int) -> tuple[list, list]:
        """The first ``size`` keys of the drift or shadow queue and their items, marked as evaluated."""
        queue = self.drift_queue if kind == "drift" else self.shadow_queue
        keys = list(queue)[:size]
        items = [queue.pop(k) for k in keys]
        (self.seen if kind == "drift" else self.shadow_seen).update(keys)
        return keys, items

    def give_back(self, keys: list, items: dict) -> None:
        """Drift queries of a failed evaluation go back to the front of the queue, to be retried."""
        self.seen.difference_update(keys)
        old = list(self.drift_queue.items())
        self.drift_queue.clear()
        self.drift_queue.update((k, items[k]) for k in keys)
        self.drift_queue.update(old)

    def event(self, event: str, **kw) -> None:
        self.events.append({"event": event, "time": time.time(), **kw})
        del self.events[:-50]

    # checkpoint: the snapshot's keys as they have always been
    def state(self) -> dict:
        return {"seq": self.seq, "window": list(self.window), "drift_queue": list(self.drift_queue.items()),
                "shadow_queue": list(self.shadow_queue.items()), "seen": sorted(self.seen),
                "shadow_seen": sorted(self.shadow_seen), "stats": self.stats, "events": self.events}

    def restore(self, snap: dict) -> None:
        self.seq = snap["seq"]
        self.window.extend(snap["window"])
        self.drift_queue.update((k, v) for k, v in snap["drift_queue"])
        self.shadow_queue.update((k, v) for k, v in snap["shadow_queue"])
        self.seen, self.shadow_seen = set(snap["seen"]), set(snap["shadow_seen"])
        self.stats, self.events = snap["stats"], snap["events"]
