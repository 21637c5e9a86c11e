"""A key's budget and rate admitted at the ingress replica, on leases from the keys ledger.

An ingress replica holds, for each key it is serving, a **lease**: a slice of the key's budget (USD the ledger holds
for the replica, as one hold among the key's others) and of its rate (request starts the ledger counted for it). The
replica admits, holds and settles that key's requests against its lease without a call; what its answers cost reaches
the ledger in batches (``FLUSH_S``), each batch lowering the lease by what it charged; a batch is numbered and sent
until the ledger acknowledges it, and the ledger applies each number once (a call past its timeout that the ledger did
carry out charges nothing twice). A lease that cannot cover a
request is grown by one call (``Ledger.lease``: granted only where what the key spent and holds, every lease included,
leaves room for it — the same rule a request's own hold meets); one the ledger cannot grow leaves that request to the
ledger alone, exactly as before leases (``LedgerClient.admit``). A lease idle for ``LEASE_IDLE_S`` is given back.

What this bounds (docs/operations/security.md): a key's spend never passes its budget by more than it did without
leases — every lease is held at the ledger before anything is admitted on it. Near its end, a budget may refuse a
request while other replicas' leases hold unused parts of it (each at most a ``LEASE_SHARE``-th of what was left when
it was granted, beyond the request that asked for it), for at most ``LEASE_IDLE_S`` after those replicas' last use. A
replica that dies loses nothing settled that it had sent; its lease is charged in full after ``LEASE_TTL_S`` without a
batch (its requests in flight charged their holds, as a hold never settled is; the rest of it too, which is what it can
cost a key), a later batch from a replica that was only slow credited against that charge."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid

from proxray.common.shared_actor import SharedStateDown

logger = logging.getLogger("ray.serve")

FLUSH_S = 0.2  # answers' charges reach the ledger in a batch this often
LEASE_IDLE_S = 1.0  # a lease with nothing in flight, unused this long, is given back
LEASE_TTL_S = 15.0  # a lease with no batch in this long (its replica died) is charged in full
LEASE_SHARE = 4  # a lease is granted more than its request needs only up to this share of the budget's room
RATE_LEASE_MIN = 120  # requests a minute from which a key's rate is leased (below, the ledger admits each request)
LEASE_SECONDS = 1.0  # a lease asks for this many seconds of the key's recent use (at least two requests' worth)


class Leasing:
    """The ledger's side (mixed into ``KeyLedger``): leases granted as holds (``lease``), lowered by batches and given
    back (``flush``). A lease is the hold of ticket ``lease_id``; its request starts are kept to be given back."""

    def _leased(self) -> dict:
        if not hasattr(self, "leased_starts"):
            self.leased_starts = {}  # name -> {lease_id: the start times it was granted}
        return self.leased_starts

    def _applied(self) -> dict:
        if not hasattr(self, "applied"):
            self.applied = {}  # name -> {batch stream: [the last batch applied, when]}, checkpointed with the rest
        return self.applied

    def _state(self) -> dict:
        return {**super()._state(), "applied": self._applied()}

    def _load(self, state: dict) -> None:
        super()._load(state)
        self.applied = {n: {b: list(v) for b, v in streams.items()} for n, streams in state.get("applied", {}).items()}

    def lease(self, name: str, rpm: float | None, budget: dict | None, lease_id: str, usd: float = 0.0,
              need_usd: float = 0.0, requests: int = 0, now: float | None = None) -> dict:
        """Grow lease ``lease_id`` of key ``name`` by up to ``requests`` request starts (within ``rpm``) and up to
        ``usd`` of its budget — granted only where what the key spent and holds (every lease included) leaves room for
        ``need_usd``, and then at most ``max(need_usd, room / LEASE_SHARE)``. ``{"usd", "requests", "retry_after_s",
        "spent_usd"}``: what was granted; ``retry_after_s`` where the rate had no start left."""
        now = time.time() if now is None else now
        out = {"usd": 0.0, "requests": 0, "retry_after_s": 0.0, "spent_usd": 0.0}
        if rpm and requests:
            recent = self.starts.get(name)
            if recent is None:
                recent = self.starts[name] = self._deque()
            while recent and recent[0] <= now - 60.0:
                recent.popleft()
            free = int(rpm) - len(recent)
            if free <= 0:
                out["retry_after_s"] = round(recent[0] + 60.0 - now, 3)
            else:
                k = min(int(requests), free)
                recent.extend([now] * k)
                self._leased().setdefault(name, {}).setdefault(lease_id, []).extend([now] * k)
                out["requests"] = k
        if budget:
            spent = self._spent(name, budget, now)
            room = budget["usd"] - spent
            grant = min(float(usd), max(float(need_usd), room / LEASE_SHARE))
            if grant > 0 and need_usd <= grant <= room:
                holds = self.holds.setdefault(name, {})
                held = holds.get(lease_id, (0.0, 0.0))[0]
                holds[lease_id] = (held + grant, now + LEASE_TTL_S)
                out["usd"], spent = grant, spent + grant
            out["spent_usd"] = spent
        self._dirty()
        return out

    def flush(self, name: str, lease_id: str | None, budget: dict | None, charged: float, tokens=None,
              give_back: bool = False, unused: int = 0, now: float | None = None, stream: str | None = None,
              seq: int = 0) -> dict:
        """A batch of key ``name``'s answers settled on lease ``lease_id`` (None: a key charged without one): ``charged``
        USD charged and the lease lowered by as much, its time renewed — or, ``give_back``, the lease ended and its
        ``unused`` request starts given back. A lease that had expired (charged in full) is credited: what it charges
        now counts against that charge. ``{"gone", "spent_usd", "usd"}``: ``gone`` where the lease is no longer held,
        ``usd`` what it holds now. Batch ``seq`` of ``stream`` is applied once: a batch sent again (its answer lost, a
        call past its timeout that the ledger did carry out) changes nothing."""
        now = time.time() if now is None else now
        if stream is not None:
            seen = self._applied().setdefault(name, {})
            if seen.get(stream, [-1])[0] >= seq:
                spent = self._spent(name, budget, now) if budget else 0.0
                return {"gone": False, "spent_usd": spent, "usd": (self.holds.get(name) or {}).get(lease_id, (0.0,))[0]}
            seen[stream] = [seq, now]
            for other, (_, when) in list(seen.items()):  # a stream silent for a day sends no more
                if when < now - 86400:
                    del seen[other]
        holds, leased = self.holds.get(name) or {}, self._leased().get(name, {})
        gone = False
        if lease_id is not None and (lease_id in holds or lease_id in leased):
            if give_back:
                holds.pop(lease_id, None)
                times, recent = leased.pop(lease_id, []), self.starts.get(name)
                for t in times[len(times) - min(int(unused), len(times)):]:
                    if recent is not None and t in recent:
                        recent.remove(t)
            elif lease_id in holds:
                holds[lease_id] = (max(holds[lease_id][0] - float(charged), 0.0), now + LEASE_TTL_S)
        elif lease_id is not None:  # expired and charged in full: what it settles now is credited against that
            late = self.expired.get(name) or {}
            credit, when = late.get(lease_id, (0.0, now))
            covered = min(float(charged), credit)
            if lease_id in late:
                late[lease_id] = (credit - covered, when)
            charged, gone = float(charged) - covered, True
        if charged or tokens:
            self.charge(name, float(charged), now, tokens=tokens)
        self._dirty()
        spent = self._spent(name, budget, now) if budget else 0.0
        return {"gone": gone, "spent_usd": spent, "usd": (self.holds.get(name) or {}).get(lease_id, (0.0,))[0]}


class Lease:
    """One replica's lease of one key: what the ledger holds for it (``usd``), what its requests in flight hold of it
    and what its answers were charged since the last batch; the request starts it holds (``rate``)."""

    def __init__(self, name: str, budget: dict | None):
        self.id, self.name, self.budget = "lease-" + uuid.uuid4().hex, name, budget
        self.usd, self.held, self.inflight = 0.0, 0.0, {}  # the lease, its requests' holds, ticket -> hold
        self.charged, self.tokens, self.rate = 0.0, [0, 0], 0
        self.spent, self.per_s, self.count = 0.0, 0.0, 0  # the ledger's last word; the key's recent requests a second
        self.used = self.renewed = time.monotonic()
        self.gone, self.growing, self.grown = False, None, 0  # a growth in flight; growths made
        self.seq, self.unsent = 0, None  # the last batch's number; a batch not known to have arrived, sent again
        self.closed_until = 0.0  # the rate had no start left: refused here until then, without a call

    def free(self) -> float:
        return self.usd - self.charged - self.held

    def take(self, ticket: str, usd: float) -> None:
        self.inflight[ticket] = usd
        self.held += usd
        self.count += 1
        self.used = time.monotonic()

    def move(self, ticket: str, usd: float) -> None:
        self.held += usd - self.inflight[ticket]
        self.inflight[ticket] = usd

    def settle(self, ticket: str, usd: float, tokens) -> None:
        self.held -= self.inflight.pop(ticket)
        self.charged += usd
        if tokens:
            self.tokens[0] += int(tokens[0])
            self.tokens[1] += int(tokens[1])
        self.used = time.monotonic()

    def want(self, floor: float) -> float:
        """What a growth asks for: ``LEASE_SECONDS`` of the key's recent requests at ``floor`` each, two at least."""
        return floor * max(2.0, min(64.0, self.per_s * LEASE_SECONDS))


class LeasedLedger:
    """A replica's side of the keys ledger (``LedgerClient``'s calls: ``admit``, ``rehold``, ``lower``, ``settle``),
    admitting on leases where a key has a budget or a rate of ``RATE_LEASE_MIN`` a minute or more, and sending every
    key's charges in batches. ``close`` sends what is left and gives the leases back."""

    def __init__(self, client):
        self.client = client
        self.current: dict = {}  # key name -> the lease its requests are admitted on
        self.leases: set = set()  # every lease not given back yet (retired ones settle their requests in flight)
        self.tickets: dict = {}  # ticket -> the lease holding it
        self.pending: dict = {}  # key name -> [USD, prompt tokens, cached] charged without a lease, not sent yet
        self.unsent: dict = {}  # key name -> (its batch's number, USD, tokens) sent without a lease, not known to arrive
        self.stream, self.seq = "replica-" + uuid.uuid4().hex, 0  # this replica's charges without a lease, numbered
        self.task = None

    @staticmethod
    def leasable(spec) -> bool:
        rpm = spec.requests_per_minute
        return bool(spec.budget is not None or rpm) and (not rpm or rpm >= RATE_LEASE_MIN)

    def _lease_of(self, spec) -> Lease:
        budget = spec.budget.model_dump() if spec.budget else None
        lease = self.current.get(spec.name)
        if lease is None or lease.gone or lease.budget != budget:  # a changed budget: a new lease, the old retired
            lease = self.current[spec.name] = Lease(spec.name, budget)
            self.leases.add(lease)
        self._batching()
        return lease

    def _batching(self) -> None:
        """The batches' task running on this loop (the replica's: one for its life)."""
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.get_loop() is not loop:
            self.task = loop.create_task(self._batches())

    async def _grow(self, spec, lease: Lease, hold: float = 0.0, requests: int = 0) -> float:
        """One call asking the ledger to grow ``lease`` until ``hold`` USD of it is free, or (``requests``) it holds a
        request start; calls at once wait for one another's. Returns the rate's retry-after where it had no start left
        (0 otherwise). A ledger that does not answer grows nothing."""
        def enough():
            return lease.rate >= 1 if requests else lease.free() >= hold

        while lease.growing is not None:
            await asyncio.shield(lease.growing)
            if enough():
                return 0.0
        lease.growing = asyncio.get_running_loop().create_future()
        try:
            need = 0.0 if requests else hold - lease.free()
            out = await self.client.of(spec.name).call("lease", spec.name, spec.requests_per_minute, lease.budget,
                                                       lease.id, lease.want(hold) if need else 0.0, need, requests)
            lease.usd += out["usd"]
            lease.rate += out["requests"]
            lease.grown += 1
            lease.spent, lease.renewed = out["spent_usd"], time.monotonic()
            return out["retry_after_s"]
        except SharedStateDown:
            return 0.0
        finally:
            lease.growing.set_result(None)
            lease.growing = None

    async def admit(self, spec, hold_usd: float = 0.0, ticket: str | None = None) -> dict:
        """The ledger's verdict (``KeyLedger.admit``'s shape), from the key's lease where it covers the request."""
        if not self.leasable(spec):
            return await self.client.admit(spec, hold_usd, ticket)
        lease, rpm = self._lease_of(spec), spec.requests_per_minute
        if rpm and lease.rate < 1 and time.monotonic() < lease.closed_until:
            return {"ok": False, "reason": "rate", "retry_after_s": round(lease.closed_until - time.monotonic(), 3),
                    "spent_usd": lease.spent}
        if rpm and lease.rate < 1:
            retry = await self._grow(spec, lease, requests=max(2, min(int(rpm * LEASE_SECONDS / 60),
                                                                      int(lease.want(1.0)))))
            if lease.rate < 1 and retry:
                lease.closed_until = time.monotonic() + retry
                return {"ok": False, "reason": "rate", "retry_after_s": retry, "spent_usd": lease.spent}
            if lease.rate < 1:  # the ledger did not answer: it decides this one alone (or fails closed)
                return await self.client.admit(spec, hold_usd, ticket)
        if rpm:
            lease.rate -= 1
            lease.used = time.monotonic()
        if not spec.budget or ticket is None:
            return {"ok": True, "reason": None, "retry_after_s": 0.0, "spent_usd": lease.spent}
        hold = max(float(hold_usd), 0.0)
        if lease.free() < hold:
            await self._grow(spec, lease, hold)
        if lease.free() >= hold and not lease.gone:
            lease.take(ticket, hold)
            self.tickets[ticket] = lease
            return {"ok": True, "reason": None, "retry_after_s": 0.0, "spent_usd": lease.spent}
        return await self.client.admit(spec, hold, ticket, rate=not rpm)  # the ledger alone: over the budget, or down

    async def rehold(self, spec, ticket: str, usd: float) -> dict:
        """``ticket``'s hold raised to ``usd`` (``KeyLedger.rehold``'s verdict): on its lease where the lease covers it
        or grows to, else moved to a hold of its own at the ledger."""
        lease = self.tickets.get(ticket)
        if lease is None:
            return await self.client.rehold(spec, ticket, usd)
        more = usd - lease.inflight[ticket]
        if more > lease.free():
            await self._grow(spec, lease, more)
        if more <= lease.free() and not lease.gone:
            lease.move(ticket, usd)
            return {"over_budget": False, "spent_usd": lease.spent}
        lease.settle(ticket, 0.0, None)  # off the lease: the ledger holds it alone
        del self.tickets[ticket]
        verdict = await self.client.admit(spec, usd, ticket, rate=False)
        return {"over_budget": verdict["reason"] == "over_budget", "spent_usd": verdict["spent_usd"]}

    def lower(self, spec, ticket: str, usd: float) -> None:
        lease = self.tickets.get(ticket)
        if lease is None:
            self.client.lower(spec, ticket, usd)
        else:
            lease.move(ticket, usd)

    def settle(self, name: str, ticket: str | None, usd: float, tokens: tuple | None = None) -> None:
        """An answer's charge: to its lease, or (a key charged without a hold) to the next batch."""
        lease = self.tickets.pop(ticket, None) if ticket is not None else None
        if lease is not None and lease in self.leases:
            lease.settle(ticket, usd, tokens)
        elif ticket is None or lease is not None:  # no hold, or its lease already given back: the next batch
            p = self.pending.setdefault(name, [0.0, 0, 0])
            p[0] += usd
            if tokens:
                p[1], p[2] = p[1] + int(tokens[0]), p[2] + int(tokens[1])
            self._batching()
        else:
            self.client.settle(name, ticket, usd, tokens)

    async def _batches(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                await self.flush()
            except Exception:  # noqa: BLE001 - the next batch tries again
                logger.exception("proxray: keys ledger batch failed")

    async def flush(self, closing: bool = False) -> None:
        """Send every charge not sent yet; renew leases in use, give back those idle (all of them, ``closing``). A
        batch whose arrival is not known (the ledger did not answer) is sent again as it was before any new one."""
        now = time.monotonic()
        calls = []
        for name in set(self.pending) | set(self.unsent):
            if name not in self.unsent:
                usd, prompt, cached = self.pending.pop(name)
                self.seq += 1
                self.unsent[name] = (self.seq, usd, [prompt, cached])
            calls.append(self._send_charges(name))
        for lease in list(self.leases):
            lease.per_s, lease.count = 0.5 * lease.per_s + 0.5 * lease.count / FLUSH_S, 0
            if lease.unsent is None:
                retired = self.current.get(lease.name) is not lease
                # a lease still growing is not idle: its first request waits on the call that grows it (the ledger's
                # start, on a first request, can take seconds), and is admitted on it once the call returns
                back = not lease.inflight and lease.growing is None and \
                    (closing or retired or now - lease.used >= LEASE_IDLE_S)
                if not (back or lease.charged or lease.tokens != [0, 0] or now - lease.renewed >= LEASE_TTL_S / 3):
                    continue
                if back:
                    lease.gone = True  # nothing is admitted on it while it is given back
                    if self.current.get(lease.name) is lease:
                        del self.current[lease.name]
                lease.seq += 1
                lease.unsent = (lease.seq, lease.charged, lease.tokens, back)
                lease.charged, lease.tokens, lease.usd = 0.0, [0, 0], lease.usd - lease.unsent[1]
            calls.append(self._send(lease))
        if calls:
            await asyncio.gather(*calls)

    async def _send_charges(self, name: str) -> None:
        """Key ``name``'s batch of charges made without a lease; kept to be sent again where the ledger did not
        answer."""
        seq, usd, tokens = self.unsent[name]
        try:
            await self.client.of(name).call("flush", name, None, None, usd, tokens if any(tokens) else None, False, 0,
                                            None, self.stream, seq)
        except SharedStateDown:
            return
        del self.unsent[name]

    async def _send(self, lease: Lease) -> None:
        """``lease``'s batch (its charges, or its return with its unused request starts), sent until the ledger says
        it has it: nothing charged is dropped, nothing charged twice."""
        seq, usd, tokens, back = lease.unsent
        steady = lease.grown if lease.growing is None else -1  # no growth crossing this batch
        try:
            out = await self.client.of(lease.name).call("flush", lease.name, lease.id, lease.budget, usd,
                                                        tokens if any(tokens) else None, back, lease.rate, None,
                                                        lease.id, seq)
        except SharedStateDown:
            return
        lease.unsent = None
        lease.renewed, lease.spent = time.monotonic(), out["spent_usd"] or lease.spent
        if back:
            self.leases.discard(lease)
        elif out["gone"]:  # charged in full while this replica was silent, or a restarted ledger never knew it
            lease.gone, lease.usd = True, 0.0
        elif steady == lease.grown and lease.growing is None and out["usd"] < lease.usd - 1e-12:
            lease.usd = out["usd"]  # a ledger restarted from an older checkpoint holds less: admit only on that

    async def close(self) -> None:
        """The replica is stopping: every charge sent, every lease given back."""
        if self.task is not None:
            self.task.cancel()
        for _ in range(3):  # a batch sent again first, then what came after it
            await self.flush(closing=True)
            if not (self.leases or self.pending or self.unsent):
                break
