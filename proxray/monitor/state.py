"""The monitor's durable state: a snapshot (written whole, atomically, now and then) plus an append-only
journal of the reports since. A report costs one appended line, not a rewrite of the whole state;
restoring reads the snapshot and replays the journal lines newer than it (each line carries its
sequence number, so a crash between writing a snapshot and truncating the journal replays nothing twice).
On an object store (``state_dir`` a URI: storage every node reads) nothing can be appended to: each report
is one small object, ``journal/<seq>.json``, PUT whole (so none is lost and none is half-written), and a
snapshot removes the ones it holds.
A snapshot is what ``DriftMonitor.checkpoint()`` returns: each part's own ``state()`` beside the monitor's (its keys
as they have always been, so a state folder written by an earlier version restores).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from proxray.common.storage import Store, is_uri, replace_atomically


def state_store(folder):
    """The monitor's state store in ``folder``: a local folder (snapshot + appended journal file) or a URI
    (snapshot + one journal object per report)."""
    return ObjectStateStore(folder) if is_uri(folder) else FileStateStore(folder)


class ObjectStateStore:
    def __init__(self, uri):
        self.store = Store(uri)

    def load(self) -> tuple[dict | None, list]:
        """(snapshot or None, journal entries newer than it, in order)."""
        snap = json.loads(self.store.read_text("monitor_state.json")) if self.store.exists("monitor_state.json") else None
        seq = snap["seq"] if snap else -1
        entries = [json.loads(self.store.read_text(f)) for f in self.store.files("journal", ".json")]
        return snap, sorted((e for e in entries if e["seq"] > seq), key=lambda e: e["seq"])

    def append(self, entry: dict) -> None:
        self.store.write_text(f"journal/{entry['seq']:012d}.json", json.dumps(entry, separators=(",", ":")))

    def snapshot(self, state: dict) -> None:
        """Write the whole state (with its ``seq``), then remove the journal objects it holds."""
        self.store.write_text("monitor_state.json", json.dumps(state, separators=(",", ":")))
        for f in self.store.files("journal", ".json"):
            if int(f.rsplit("/", 1)[1].split(".")[0]) <= state["seq"]:
                self.store.delete(f)


class FileStateStore:
    def __init__(self, folder):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.snapshot_path = self.folder / "monitor_state.json"
        self.journal_path = self.folder / "reports.jsonl"
        self._journal = None

    def load(self) -> tuple[dict | None, list]:
        """(snapshot or None, journal entries newer than it)."""
        snap = json.loads(self.snapshot_path.read_text()) if self.snapshot_path.exists() else None
        seq = snap["seq"] if snap else -1
        entries = []
        if self.journal_path.exists():
            for line in self.journal_path.read_text().splitlines():
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a crash: the last one, nothing after it
                    break
                if e["seq"] > seq:
                    entries.append(e)
        return snap, entries

    def append(self, entry: dict) -> None:
        if self._journal is None:
            self._journal = open(self.journal_path, "a", encoding="utf-8")
        self._journal.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self._journal.flush()  # to the OS: a killed process loses nothing; a machine crash may lose the last lines

    def snapshot(self, state: dict) -> None:
        """Write the whole state (with its ``seq``) atomically, then start an empty journal."""
        replace_atomically(self.snapshot_path, json.dumps(state, separators=(",", ":")).encode())
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        with open(self.journal_path, "w", encoding="utf-8") as f:
            f.flush()
            os.fsync(f.fileno())


class Decisions:
    """What the monitor decided and must remember: the traffic groups whose J_z triggered (at which router version),
    when drift evaluations may start again (after a failure), the salt of users' query ids in the grown router, and the
    training prompts in the router's order (the table's, then those absorbed since)."""

    def __init__(self, train_prompts):
        self.triggered: dict = {}
        self.not_before = 0.0
        self.id_salt = secrets.token_hex(16)  # the grown router names traffic by ids no one can tie to a prompt
        self.train_prompts = list(train_prompts)
        self.n_table = len(self.train_prompts)  # the table's; the rest were absorbed

    def state(self) -> dict:
        return {"triggered": self.triggered, "not_before": self.not_before, "id_salt": self.id_salt,
                "train_prompts_added": self.train_prompts[self.n_table:]}

    def restore(self, snap: dict) -> None:
        self.triggered, self.not_before = snap["triggered"], snap["not_before"]
        self.id_salt = snap.get("id_salt", self.id_salt)  # snapshots before it had none
        self.train_prompts.extend(snap["train_prompts_added"])

    def public_ids(self, keys) -> list:
        """The ids users' queries get in the grown router (which ``explain`` shows every user): keyed hashes of their
        own ids (hashes of the text) under this monitor's salt, so no one can test a guessed prompt against them."""
        return ["q-" + hmac.new(self.id_salt.encode(), str(k).encode(), hashlib.sha256).hexdigest()[:20] for k in keys]


class Journal:
    """The monitor's durable state over its state store: a snapshot of every part's ``state()`` (``parts``: objects
    with ``state()`` / ``restore(snapshot)``, their keys merged), and the journal of entries since, each applied by
    ``apply`` live and on replay."""

    def __init__(self, folder, parts, apply):
        self.store, self.parts, self.apply = state_store(folder), parts, apply
        self.dirty = 0  # entries or decisions since the last snapshot

    def touch(self) -> None:
        """A decision changed outside the journal's entries (a J_z trigger): the next tick snapshots."""
        self.dirty += 1

    def record(self, entry: dict) -> None:
        """Apply a new entry and append it to the journal (under the monitor's lock)."""
        self.apply(entry)
        self.store.append(entry)
        self.dirty += 1

    def checkpoint(self) -> dict:
        out = {}
        for part in self.parts:
            out.update(part.state())
        return out

    def snapshot(self) -> None:
        self.store.snapshot(self.checkpoint())
        self.dirty = 0

    def restore(self) -> None:
        snap, entries = self.store.load()
        if snap:
            for part in self.parts:
                part.restore(snap)
        for e in entries:  # reports and feedback after the snapshot
            self.apply(e)
        self.dirty = len(entries)
