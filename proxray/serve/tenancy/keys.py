"""API keys with their own policy (``keys_file`` in the app args): each key has a name, its own λ, the models it may
be routed to, a request rate, and a budget in USD over a window — spent past it, its requests are refused with a 429
(``over_budget: reject``) or routed to the cheapest model it allows (``over_budget: cheapest``).

The file holds SHA-256 hashes of the keys, never the keys (``proxray keys new`` adds one and prints the key once); the
operator edits it and every ingress replica reads it again when it changes (checked at most every
``RELOAD_EVERY_S``), no restart. A key's rate and spend are kept in one actor per app (``KeyLedger``, namespace
``proxray``; or split by key over ``keys_ledger_shards`` of them, ``proxray.serve.tenancy.ledger``) that every
replica asks, so the limits hold across replicas. The single key of ``api_key_file`` /
``api_key_env`` keeps working beside the file, unrestricted.

    keys:
    - name: team-a
      sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      lam: 1000                  # default λ of its routed requests (a request's own lam still wins)
      allowed_models: [meta-llama/Llama-3.2-1B-Instruct, google/gemma-7b-it]
      requests_per_minute: 60
      budget: {usd: 5.0, window_s: 86400, over_budget: cheapest}
"""
from __future__ import annotations

import hashlib
import hmac
import os
import time
from typing import Literal

from pydantic import Field, field_validator

from proxray.common.shared_actor import Checkpointed
from proxray.common.yamlconfig import StrictModel

RELOAD_EVERY_S = 2.0


class KeyBudget(StrictModel):
    usd: float = Field(gt=0, description="USD the key may spend per window (the answers' cost at the models' prices)")
    window_s: float = Field(86400.0, gt=0, description="the window, seconds (a day by default)")
    over_budget: Literal["reject", "cheapest"] = Field("reject", description="past the budget: 429, or route to the "
                                                        "cheapest model the key allows")


class KeyCache(StrictModel):
    """A key's part of the app's ``response_cache``."""

    group: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$", description=(
        "a tenant group: the keys that name it share their cached answers; without one, a key's answers are its own"))
    exact: bool = Field(True, description="false: its requests are never answered from the exact cache")
    semantic: bool = Field(True, description="false: never answered from the semantic cache")


class KeySpec(StrictModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$", description="the key's name in "
                      "metrics, logs and reports")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the key, hex (the key itself is never stored)")
    lam: float | None = Field(None, ge=0, description="default λ of its routed requests")
    allowed_models: list[str] | None = Field(None, min_length=1, description="the models it may reach (routed or "
                                             "by name); default: all")
    requests_per_minute: float | None = Field(None, gt=0, description="its request rate across every replica")
    budget: KeyBudget | None = Field(None, description="what it may spend per window; none: no limit")
    max_concurrent: int | None = Field(None, ge=1, description=(
        "its requests in flight at once on one ingress replica (a stream until it ends); past it a 429 at once. "
        "Default: half the replica's router_max_ongoing_requests (32 of 64), so one key's slow requests leave the "
        "other keys room on the slots they share (the replica's, and each endpoint's max_ongoing_requests)"))
    cache: KeyCache | None = Field(None, description="its share of the response cache (group, kinds); default: "
                                   "its own scope, both kinds")
    feedback: Literal["train", "record", "off"] = Field("record", description=(
        "its POST /v1/feedback: train (the drift monitor learns from its scores), record (counted in the metrics, "
        "never trains the shared router: the default, so a careless or hostile key cannot steer it) or off (403)"))

    @property
    def owner(self) -> str:
        """Who owns what the app's stores keep for this key (stored responses, conversations, answers): its hash, so
        a name given to a new key does not inherit what the old key stored."""
        return self.sha256


class KeysFile(StrictModel):
    keys: list[KeySpec] = Field(default_factory=list, description="the keys, each name and hash once")

    @field_validator("keys")
    @classmethod
    def _unique(cls, keys):
        for field in ("name", "sha256"):
            seen = [getattr(k, field) for k in keys]
            dup = sorted({v for v in seen if seen.count(v) > 1})
            if dup:
                raise ValueError(f"keys: {field} must be unique ({dup[0][:12]}… twice)")
        return keys


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def read_keys(path) -> KeysFile:
    """The keys file, validated (errors name the field)."""
    from proxray.common.yamlconfig import load_yaml_model

    return load_yaml_model(path, KeysFile, "keys file")


class KeyRing:
    """The ingress side: which key a bearer token is (by its hash, in constant time), the file read again when it
    changes. A file that turns invalid keeps the keys read before (and says so in the log)."""

    def __init__(self, path: str):
        self.path = os.path.expanduser(path)
        self.keys: dict = {}
        self.checked = 0.0
        self.mtime = None
        self._load()

    def _load(self) -> None:
        self.mtime = os.stat(self.path).st_mtime_ns
        self.keys = {k.sha256: k for k in read_keys(self.path).keys}

    def refresh(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now - self.checked < RELOAD_EVERY_S:
            return
        self.checked = now
        try:
            if os.stat(self.path).st_mtime_ns != self.mtime:
                self._load()
        except (OSError, ValueError) as e:
            import logging

            logging.getLogger("ray.serve").warning("proxray: keys file %s not reloaded: %s", self.path,
                                                   str(e).splitlines()[0][:200])

    def identify(self, token: str) -> KeySpec | None:
        self.refresh()
        digest = key_hash(token)
        for h, spec in self.keys.items():
            if hmac.compare_digest(h, digest):
                return spec
        return None


BUCKETS = 60  # a budget's window is kept as this many fixed buckets of spend
HOLD_TTL_S = 900.0  # a hold never settled (its replica died with the request) is charged in full after this


class SpendWindow:
    """USD spent over a sliding window, kept in ``BUCKETS`` fixed buckets of ``window_s / BUCKETS`` seconds: adding
    and summing cost the same whatever the traffic, and a key's memory is ``BUCKETS`` numbers. A charge leaves the
    window between ``window_s - window_s / BUCKETS`` and ``window_s`` after it was made."""

    def __init__(self, window_s: float):
        self.width = window_s / BUCKETS
        self.sums, self.ids = [0.0] * BUCKETS, [-BUCKETS] * BUCKETS

    def add(self, usd: float, now: float) -> None:
        b = int(now // self.width)
        i = b % BUCKETS
        if self.ids[i] != b:
            self.ids[i], self.sums[i] = b, 0.0
        self.sums[i] += usd

    def total(self, now: float) -> float:
        b = int(now // self.width)
        return sum(s for s, i in zip(self.sums, self.ids) if b - i < BUCKETS)


class KeyLedger(Checkpointed):
    """Requests and spend per key across every ingress replica (the app's shared actor, checkpointed in the cluster's
    key-value store at most every second while it is used, and started from its checkpoint after it died). Admission costs the same
    whatever the traffic: a key's rate is the start times of its last minute (at most ``requests_per_minute`` of
    them), its spend a ``SpendWindow``; a key with neither limit leaves nothing here but its total.

    Budgets are **held, then settled**: an admitted request holds an upper bound of its cost (``admit(…,
    hold_usd, ticket)``) until its answer ends and ``settle`` replaces the hold by what the answer cost. Holds count as
    spent, and a request is within the budget only while what is spent and held *and its own hold* fit in it, so
    requests admitted at once cannot together spend past the budget. A hold that expires (its replica died with the
    request, or a stream outlived ``HOLD_TTL_S``) is charged in full; its late ``settle`` charges only the difference."""

    def __init__(self, checkpoint: str = ""):
        from collections import deque

        self._deque = deque
        self.starts: dict = {}  # name -> deque of its request start times within the last minute
        self.windows: dict = {}  # name -> SpendWindow
        self.holds: dict = {}  # name -> {ticket: (usd, expires)}
        self.expired: dict = {}  # name -> {ticket: (usd charged when its hold expired, when)}, for a late settle
        self.totals: dict = {}  # name -> USD charged (what ``report`` shows)
        self.tokens: dict = {}  # name -> [prompt tokens, of them read from a provider's prompt cache] of its answers
        self.checkpoint_key = checkpoint
        self._restore()

    def _state(self) -> dict:
        return {"starts": {n: list(d) for n, d in self.starts.items()},
                "windows": {n: [w.width, w.sums, w.ids] for n, w in self.windows.items()},
                "holds": self.holds, "totals": self.totals, "expired": self.expired, "tokens": self.tokens}

    def _load(self, state: dict) -> None:
        self.starts = {n: self._deque(v) for n, v in state["starts"].items()}
        for n, (width, sums, ids) in state["windows"].items():
            w = self.windows[n] = SpendWindow(width * BUCKETS)
            w.sums, w.ids = list(sums), list(ids)
        self.holds = {n: {t: tuple(h) for t, h in v.items()} for n, v in state["holds"].items()}
        self.totals = dict(state["totals"])
        self.expired = {n: {t: tuple(e) for t, e in v.items()} for n, v in state.get("expired", {}).items()}
        self.tokens = {n: list(v) for n, v in state.get("tokens", {}).items()}

    def admit(self, name: str, rpm: float | None, budget: dict | None, hold_usd: float = 0.0, ticket: str | None = None,
              now: float | None = None) -> dict:
        """Whether ``name`` may send a request now: ``{"ok", "reason", "retry_after_s", "spent_usd"}``. An admitted
        request counts toward its rate; with a ``ticket`` it holds ``hold_usd`` of its budget (also over the budget:
        the caller routes it to the cheapest model or refuses it and ``settle``s the ticket at 0)."""
        now = time.time() if now is None else now
        spent = self._spent(name, budget, now) if budget else 0.0
        if rpm:
            recent = self.starts.get(name)
            if recent is None:
                recent = self.starts[name] = self._deque()
            while recent and recent[0] <= now - 60.0:
                recent.popleft()
            if len(recent) >= rpm:
                return {"ok": False, "reason": "rate", "retry_after_s": round(recent[0] + 60.0 - now, 3),
                        "spent_usd": spent}
            recent.append(now)
        over = bool(budget) and spent + max(float(hold_usd), 0.0) > budget["usd"]
        if budget and ticket is not None:
            self.holds.setdefault(name, {})[ticket] = (max(float(hold_usd), 0.0), now + HOLD_TTL_S)
        self._dirty()
        return {"ok": True, "reason": "over_budget" if over else None, "retry_after_s": 0.0, "spent_usd": spent}

    def rehold(self, name: str, budget: dict, ticket: str, usd: float, now: float | None = None) -> dict:
        """A held request's hold moved to ``usd`` once it is planned (its chosen model's bound): ``{"over_budget",
        "spent_usd"}``, whether what is spent and held, this hold included, is past the budget."""
        now = time.time() if now is None else now
        holds = self.holds.get(name) or {}
        if ticket in holds:
            holds[ticket] = (max(float(usd), 0.0), holds[ticket][1])
            self._dirty()
        spent = self._spent(name, budget, now)
        return {"over_budget": spent > budget["usd"], "spent_usd": spent}

    def settle(self, name: str, ticket: str, usd: float, now: float | None = None, tokens=None) -> None:
        """A held request's answer ended: its hold is replaced by ``usd``, what it cost (a hold that had expired and
        was charged: the difference); ``tokens``: its (prompt, cached) tokens, where its usage said."""
        (self.holds.get(name) or {}).pop(ticket, None)
        charged, _ = (self.expired.get(name) or {}).pop(ticket, (0.0, None))
        self.charge(name, usd - charged, now, tokens=tokens)

    def charge(self, name: str, usd: float, now: float | None = None, window_s: float | None = None,
               tokens=None) -> None:
        now = time.time() if now is None else now
        if tokens:
            seen = self.tokens.setdefault(name, [0, 0])
            seen[0], seen[1] = seen[0] + int(tokens[0]), seen[1] + int(tokens[1])
        self.totals[name] = self.totals.get(name, 0.0) + float(usd)
        window = self.windows.get(name)
        if window is None and window_s is not None:
            window = self.windows[name] = SpendWindow(window_s)
        if window is not None:
            window.add(float(usd), now)
        self._dirty()

    def _spent(self, name: str, budget: dict, now: float) -> float:
        """Settled spend in the budget's window plus what is held; a hold past its time is charged in full."""
        window = self.windows.get(name)
        if window is None or abs(window.width * BUCKETS - budget["window_s"]) > 1e-9:  # new, or its window changed
            window = self.windows[name] = SpendWindow(budget["window_s"])
        holds = self.holds.get(name) or {}
        for ticket, (usd, expires) in list(holds.items()):
            if expires <= now:
                del holds[ticket]
                self.charge(name, usd, now)
                late = self.expired.setdefault(name, {})
                late[ticket] = (usd, now)
                for t, (_, when) in list(late.items()):  # a settle later than a day is not coming
                    if when < now - 86400:
                        del late[t]
        return window.total(now) + sum(usd for usd, _ in holds.values())

    def report(self) -> dict:
        """Per key: USD charged, USD held by requests not settled yet, and its answers' prompt tokens with the share
        of them its providers read from their prompt cache (billed at the cache-read price)."""
        out = {}
        for name in set(self.totals) | set(self.holds) | set(self.tokens):
            prompt, cached = self.tokens.get(name, [0, 0])
            out[name] = {"spent_usd": self.totals.get(name, 0.0),
                         "held_usd": sum(usd for usd, _ in (self.holds.get(name) or {}).values()),
                         "prompt_tokens": prompt, "cached_tokens": cached,
                         "cached_share": round(cached / prompt, 6) if prompt else None}
        return out


def new_key_entry(path, name: str, **policy) -> str:
    """Add a key named ``name`` to the keys file at ``path`` (created if absent; written atomically, mode 600) and
    return the key — the only time it is seen; the file keeps its hash."""
    import secrets
    from pathlib import Path

    import yaml

    from proxray.common.storage import replace_atomically

    path = Path(path).expanduser()
    current = read_keys(path) if path.exists() else KeysFile()
    key = "sk-proxray-" + secrets.token_urlsafe(32)
    spec = KeySpec(name=name, sha256=key_hash(key), **{k: v for k, v in policy.items() if v is not None})
    updated = KeysFile(keys=[*current.keys, spec])  # checks the name is new
    replace_atomically(path, yaml.safe_dump(updated.model_dump(exclude_none=True), sort_keys=False).encode())
    os.chmod(path, 0o600)
    return key
