"""The keys ledger of an app, in one actor or split over ``keys_ledger_shards`` of them by key.

One ``KeyLedger`` actor answers ~1,300–1,900 calls a second on a 2-core machine (``bench/bench_actors.py``). The
replicas admit a busy key on leases (``proxray.serve.tenancy.leases``): a lease's growth and ~5 batches a second per
replica, whatever the key's rate; a key with a slower rate than ``RATE_LEASE_MIN`` costs an admission and a settle per
request. Past what one ledger carries an app splits its keys over ``n`` ledgers: a key's every call (admit, rehold,
settle, charge) goes to the ledger its name hashes to (``shard_of``: SHA-256, the same in every replica and every
process), so a key's rate and budget are kept whole by one actor and stay exactly what one ledger keeps — no
budget is split, summed or reconciled across shards. The ledgers are ``proxray-keys-<app>`` for one shard and
``proxray-keys-<app>-<i>of<n>`` for shard ``i`` of ``n`` (namespace ``proxray``).

A changed shard count is a new layout: each new ledger starts from every checkpoint of the app's ledgers, old layouts
included, and keeps the keys it owns, each from the checkpoint that saved it last, so spend and holds carry over. While
a redeploy rolls the replicas over, replicas of both layouts answer: for those seconds a key's requests may be admitted
by two ledgers, each holding its own part of the budget."""
from __future__ import annotations

import hashlib
import json
import re

from proxray.common.shared_actor import SharedActorClient, SharedStateDown
from proxray.serve.errors import RequestError
from proxray.serve.tenancy.keys import KeyLedger, KeySpec
from proxray.serve.tenancy.leases import Leasing

PREFIX = "proxray-keys"
MAX_SHARDS = 64


def shard_of(name: str, shards: int) -> int:
    """Which of ``shards`` ledgers keeps key ``name``: the same answer in every process (not Python's salted hash)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % shards if shards > 1 else 0


def shard_name(app_name: str, shard: int, shards: int) -> str:
    return f"{PREFIX}-{app_name}" if shards == 1 else f"{PREFIX}-{app_name}-{shard}of{shards}"


def is_ledger_of(app_name: str, name: str) -> bool:
    """Whether ``name`` is one of app ``app_name``'s ledgers, in any layout (not another app's whose name extends it)."""
    base = f"{PREFIX}-{app_name}"
    return name == base or re.fullmatch(re.escape(base) + r"-\d+of\d+", name) is not None


def merged_state(states: list[dict], owns) -> dict:
    """One ledger's state from the checkpoints of every layout: each key ``owns(name)`` accepts, taken whole from the
    checkpoint that saved it last (``saved_at``; a checkpoint without one is older than any with one)."""
    parts = ("starts", "windows", "holds", "totals", "expired", "tokens", "applied")
    latest: dict = {}  # name -> (saved_at, state)
    for st in states:
        at = float(st.get("saved_at", 0.0))
        for part in parts:
            for name in st.get(part, {}):
                if owns(name) and (name not in latest or at > latest[name][0]):
                    latest[name] = (at, st)
    out: dict = {part: {} for part in parts}
    for name, (_, st) in latest.items():
        for part in parts:
            if name in st.get(part, {}):
                out[part][name] = st[part][name]
    return out


class ShardedKeyLedger(Leasing, KeyLedger):
    """Shard ``shard`` of ``shards`` of app ``app_name``'s ledgers: a ``KeyLedger`` that starts from every layout's
    checkpoints, keeping the keys it owns, and grants the replicas leases (``proxray.serve.tenancy.leases``)."""

    def __init__(self, checkpoint: str = "", shard: int = 0, shards: int = 1, app_name: str | None = None):
        self.shard, self.shards, self.app_name = shard, shards, app_name
        super().__init__(checkpoint)

    def _state(self) -> dict:
        import time

        return {**super()._state(), "saved_at": time.time()}

    def _restore(self) -> None:
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized, _internal_kv_list

        from proxray.common.actors import NAMESPACE

        self._checkpoints_start()
        if not (self.checkpoint_key and _internal_kv_initialized()):
            return
        family = self.checkpoint_key if self.app_name is None else f"{PREFIX}-{self.app_name}"
        states = []
        for key in _internal_kv_list(family, namespace=NAMESPACE):
            key = key.decode() if isinstance(key, bytes) else key
            if key == self.checkpoint_key or (self.app_name is not None and is_ledger_of(self.app_name, key)):
                raw = _internal_kv_get(key, namespace=NAMESPACE)
                if raw:
                    states.append(json.loads(raw))
        if states:
            self._load(merged_state(states, lambda name: shard_of(name, self.shards) == self.shard))


class LedgerShard(SharedActorClient):
    actor_cls, prefix = ShardedKeyLedger, PREFIX

    def __init__(self, app_name: str, shard: int, shards: int):
        super().__init__(app_name, name=shard_name(app_name, shard, shards))
        self.shard, self.shards, self.app_name = shard, shards, app_name

    def actor_args(self) -> tuple:
        return (self.name, self.shard, self.shards, self.app_name)  # its checkpoint's key, which keys it keeps


class LedgerClient:
    """A replica's side of the app's keys ledgers: each key's calls to the ledger that keeps it. A ledger that does
    not answer fails closed for its keys (a 503 naming it); the other shards' keys are not affected."""

    def __init__(self, app_name: str, shards: int = 1):
        self.shards = [LedgerShard(app_name, i, shards) for i in range(shards)]

    def of(self, name: str) -> LedgerShard:
        return self.shards[shard_of(name, len(self.shards))]

    async def admit(self, spec: KeySpec, hold_usd: float = 0.0, ticket: str | None = None, rate: bool = True) -> dict:
        """The ledger's verdict (``rate=False``: the request's start counted already, on a lease); a ledger that does
        not answer fails closed: a 503 naming it (retry shortly)."""
        try:
            return await self.of(spec.name).call("admit", spec.name, spec.requests_per_minute if rate else None,
                                                 spec.budget.model_dump() if spec.budget else None, hold_usd, ticket)
        except SharedStateDown as e:
            raise RequestError(503, f"key {spec.name!r}: its rate and budget cannot be checked right now (the keys "
                               "ledger is restarting); retry in a few seconds", kind="service_unavailable",
                               headers={"retry-after": "2"}) from e

    def lower(self, spec: KeySpec, ticket: str, usd: float) -> None:
        """The hold of ``ticket`` lowered to ``usd``, sent without waiting (a lower hold needs no verdict)."""
        self.of(spec.name).tell("rehold", spec.name, spec.budget.model_dump(), ticket, usd)

    async def rehold(self, spec: KeySpec, ticket: str, usd: float) -> dict:
        """The hold of ``ticket`` raised to ``usd``: the ledger's verdict on the budget; a ledger that does not answer
        fails closed (a 503 naming it)."""
        try:
            return await self.of(spec.name).call("rehold", spec.name, spec.budget.model_dump(), ticket, usd)
        except SharedStateDown as e:
            raise RequestError(503, f"key {spec.name!r}: its budget cannot be checked right now (the keys ledger is "
                               "restarting); retry in a few seconds", kind="service_unavailable",
                               headers={"retry-after": "2"}) from e

    def settle(self, name: str, ticket: str | None, usd: float, tokens: tuple | None = None) -> None:
        if ticket is None:
            self.of(name).tell("charge", name, usd, None, None, tokens)
        else:
            self.of(name).tell("settle", name, ticket, usd, None, tokens)


def running_ledgers(app_name: str) -> list[str]:
    """The names of app ``app_name``'s ledgers running now, every layout (for ``proxray keys report``)."""
    from ray.util import list_named_actors

    from proxray.common.actors import NAMESPACE

    return sorted(a["name"] for a in list_named_actors(all_namespaces=True)
                  if a.get("namespace") == NAMESPACE and is_ledger_of(app_name, a["name"]))


def merged_reports(reports: list[dict]) -> dict:
    """Each key's report from its ledger's: one per key within a layout; where ledgers of an earlier layout still run,
    the one that charged the key most (a new layout's ledger started from the earlier one's figures)."""
    out: dict = {}
    for rep in reports:
        for name, r in rep.items():
            if name not in out or r["spent_usd"] > out[name]["spent_usd"]:
                out[name] = r
    return out
