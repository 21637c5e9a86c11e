"""Keys admitted at the replica on leases (proxray.serve.tenancy.leases): the ledger's grants and batches on a real
ledger, and replicas' ``LeasedLedger``s over it in one event loop — the ledger's calls made in process, counted, and
made to fail where a test takes the ledger down."""
import asyncio

import pytest

from proxray.serve.tenancy.keys import KeySpec
from proxray.serve.tenancy.leases import FLUSH_S, LEASE_SHARE, LEASE_TTL_S, LeasedLedger
from proxray.serve.tenancy.ledger import LedgerClient, ShardedKeyLedger
from proxray.common.shared_actor import SharedStateDown

BUDGET = {"usd": 1.0, "window_s": 3600.0, "over_budget": "reject"}


def test_a_lease_is_granted_from_the_budgets_room_and_lowered_by_what_its_batches_charge():
    led = ShardedKeyLedger()
    first = led.lease("k", None, BUDGET, "L1", usd=0.8, need_usd=0.1, now=0.0)
    assert first["usd"] == pytest.approx(1.0 / LEASE_SHARE)  # more than needed only up to a share of the room
    assert led.report()["k"]["held_usd"] == pytest.approx(0.25)
    assert led.lease("k", None, BUDGET, "L2", usd=0.9, need_usd=0.9, now=0.0)["usd"] == 0.0  # 0.25 held: no room
    assert led.lease("k", None, BUDGET, "L2", usd=0.75, need_usd=0.75, now=0.0)["usd"] == pytest.approx(0.75)
    out = led.flush("k", "L1", BUDGET, 0.2, tokens=[100, 40], now=1.0)
    assert out == {"gone": False, "spent_usd": pytest.approx(1.0), "usd": pytest.approx(0.05)}  # 0.2 charged
    rep = led.report()["k"]
    assert rep["spent_usd"] == pytest.approx(0.2) and rep["held_usd"] == pytest.approx(0.8)
    assert rep["prompt_tokens"] == 100 and rep["cached_tokens"] == 40
    led.flush("k", "L2", BUDGET, 0.0, give_back=True, now=1.0)
    led.flush("k", "L1", BUDGET, 0.05, give_back=True, now=1.0)
    assert led.report()["k"]["held_usd"] == 0.0 and led.report()["k"]["spent_usd"] == pytest.approx(0.25)


def test_a_lease_not_renewed_is_charged_in_full_and_its_late_batch_credited():
    led = ShardedKeyLedger()
    led.lease("k", None, BUDGET, "L", usd=0.4, need_usd=0.4, now=0.0)
    led.admit("k", None, BUDGET, 0.0, None, now=LEASE_TTL_S + 1)  # its replica silent: charged in full
    assert led.report()["k"]["spent_usd"] == pytest.approx(0.4)
    assert led.flush("k", "L", BUDGET, 0.3, now=LEASE_TTL_S + 2)["gone"]  # it was only slow: 0.3 of the 0.4
    assert led.flush("k", "L", BUDGET, 0.2, now=LEASE_TTL_S + 3)["gone"]  # 0.1 credit left, 0.1 charged
    assert led.report()["k"]["spent_usd"] == pytest.approx(0.5)


def test_a_leases_unused_request_starts_are_given_back():
    led = ShardedKeyLedger()
    assert led.lease("k", 5, None, "L", requests=4, now=0.0)["requests"] == 4
    out = led.lease("k", 5, None, "M", requests=4, now=0.0)
    assert out["requests"] == 1
    assert led.lease("k", 5, None, "N", requests=1, now=1.0) == {"usd": 0.0, "requests": 0, "retry_after_s": 59.0,
                                                                  "spent_usd": 0.0}
    led.flush("k", "L", None, 0.0, give_back=True, unused=3, now=2.0)  # it used one of its four
    assert led.lease("k", 5, None, "N", requests=9, now=2.0)["requests"] == 3


class InProcess:
    """A ledger shard's client calling a real ledger in this process, every call counted; ``down`` refuses them."""

    def __init__(self, ledger):
        self.ledger, self.calls, self.down, self.lost = ledger, [], False, 0

    async def call(self, method, *args, **_):
        await asyncio.sleep(0)
        if self.down:
            raise SharedStateDown("proxray-keys-test", "down for this test")
        self.calls.append(method)
        out = getattr(self.ledger, method)(*args)
        if self.lost and method == "flush":  # carried out, but its answer never came back (a call past its timeout)
            self.lost -= 1
            raise SharedStateDown("proxray-keys-test", "no answer within 2 s")
        return out

    def tell(self, method, *args):
        asyncio.get_running_loop().create_task(self.call(method, *args))


def replicas(n):
    """A real ledger, ``n`` replicas' ``LeasedLedger``s over it and the shard client they share."""
    ledger = ShardedKeyLedger()
    shard = InProcess(ledger)
    out = []
    for _ in range(n):
        client = LedgerClient.__new__(LedgerClient)
        client.shards = [shard]
        out.append(LeasedLedger(client))
    return ledger, out, shard


def key(name="k", **kw):
    return KeySpec(name=name, sha256="0" * 64, **kw)


def test_a_burst_over_two_replicas_spends_no_more_than_its_budget_and_costs_few_ledger_calls():
    """40 requests at once, each holding 0.1 and costing 0.1, on a 0.5 budget over two replicas: at most 5 answered,
    each replica's requests admitted on its lease; spend equals what was settled once both gave their leases back."""
    ledger, (a, b), shard = replicas(2)
    spec = key(budget={"usd": 0.5, "window_s": 3600})

    async def one(rep, i):
        v = await rep.admit(spec, 0.1, f"t{i}")
        ok = v["ok"] and v["reason"] is None
        await asyncio.sleep(0.01)
        rep.settle("k", f"t{i}", 0.1 if ok else 0.0)
        return ok

    async def main():
        answered = sum(await asyncio.gather(*(one(a if i % 2 else b, i) for i in range(40))))
        for rep in (a, b):
            await rep.close()
        return answered

    answered = asyncio.run(main())
    rep = ledger.report()["k"]
    assert answered == 5 and rep["spent_usd"] == pytest.approx(0.5) and rep["held_usd"] == pytest.approx(0.0)


def test_a_first_request_whose_lease_takes_longer_than_the_idle_time_to_grow_is_charged():
    """The first request of a key waits on the call that grows its new lease (here 1.5 s: a ledger actor starting on a
    loaded node), while the replica's batches run every 0.2 s. The lease is not given back as idle meanwhile: the
    request is admitted on it and its charge reaches the ledger (it was lost before: a lease given back while it grew
    took the request's charge with it)."""
    from proxray.serve.tenancy.leases import LEASE_IDLE_S

    ledger, (rep,), shard = replicas(1)
    spec = key(budget={"usd": 10.0, "window_s": 3600})
    call = shard.call

    async def slow(method, *args, **kw):
        if method == "lease":
            await asyncio.sleep(LEASE_IDLE_S * 1.5)
        return await call(method, *args, **kw)

    shard.call = slow

    async def main():
        v = await rep.admit(spec, 0.1, "t1")
        assert v["ok"] and v["reason"] is None
        rep.settle("k", "t1", 0.07)
        await asyncio.sleep(3 * FLUSH_S)
        await rep.close()

    asyncio.run(main())
    out = ledger.report()["k"]
    assert out["spent_usd"] == pytest.approx(0.07) and out["held_usd"] == 0.0, out


def test_a_steady_key_is_admitted_without_a_ledger_call_per_request():
    ledger, (rep,), shard = replicas(1)
    spec = key(budget={"usd": 100.0, "window_s": 3600})

    async def main():
        for i in range(200):
            v = await rep.admit(spec, 0.01, f"t{i}")
            assert v["ok"] and v["reason"] is None
            rep.lower(spec, f"t{i}", 0.005)
            rep.settle("k", f"t{i}", 0.002, (10, 4))
            if i % 20 == 0:
                await asyncio.sleep(FLUSH_S)  # the batches run
        await rep.close()

    asyncio.run(main())
    assert len(shard.calls) <= 40, shard.calls  # a request's admission, lowering and settling cost no call of their own
    out = ledger.report()["k"]
    assert out["spent_usd"] == pytest.approx(0.4) and out["held_usd"] == 0.0 and out["prompt_tokens"] == 2000


def test_charges_made_while_the_ledger_is_down_reach_it_once_it_answers():
    ledger, (rep,), shard = replicas(1)
    spec = key(budget={"usd": 10.0, "window_s": 3600})

    async def main():
        for i in range(5):
            await rep.admit(spec, 0.1, f"t{i}")
        shard.down = True
        for i in range(5):
            rep.settle("k", f"t{i}", 0.05)
            rep.settle("plain", None, 0.01)  # a key without a budget, charged
        await asyncio.sleep(3 * FLUSH_S)
        assert ledger.report().get("plain") is None
        still = await rep.admit(spec, 0.1, "t9")  # admitted on the lease while the ledger is away
        assert still["ok"]
        rep.settle("k", "t9", 0.05)
        shard.down = False
        await rep.close()

    asyncio.run(main())
    out = ledger.report()
    assert out["k"]["spent_usd"] == pytest.approx(0.3) and out["k"]["held_usd"] == 0.0
    assert out["plain"]["spent_usd"] == pytest.approx(0.05)


def test_a_ledger_restarted_from_an_older_checkpoint_is_believed_where_it_holds_less():
    ledger, (rep,), shard = replicas(1)
    spec = key(budget={"usd": 1.0, "window_s": 3600})

    async def main():
        await rep.admit(spec, 0.1, "a")
        lease = rep.current["k"]
        assert lease.usd == pytest.approx(0.2)
        ledger.holds["k"][lease.id] = (0.12, ledger.holds["k"][lease.id][1])  # what an older checkpoint held
        rep.settle("k", "a", 0.05)
        await asyncio.sleep(2 * FLUSH_S)
        assert lease.usd == pytest.approx(0.07) and lease.free() == pytest.approx(0.07)
        await rep.close()

    asyncio.run(main())
    assert ledger.report()["k"]["held_usd"] == 0.0 and ledger.report()["k"]["spent_usd"] == pytest.approx(0.05)


def test_a_batch_whose_answer_was_lost_is_sent_again_and_charged_once():
    """The ledger carries out a batch, and its answer never comes (a call past its timeout): the replica sends it again
    until it is acknowledged, and the ledger applies it once — with a lease and without one."""
    ledger, (rep,), shard = replicas(1)
    budgeted = key(budget={"usd": 10.0, "window_s": 3600})

    async def main():
        verdicts = await asyncio.gather(*(rep.admit(budgeted, 0.1, f"t{i}") for i in range(4)))
        assert all(v["ok"] for v in verdicts)
        shard.lost = 4  # the next batches arrive, their answers do not
        for i in range(4):
            rep.settle("k", f"t{i}", 0.05)
            rep.settle("plain", None, 0.01)
        await asyncio.sleep(4 * FLUSH_S)
        rep.settle("plain", None, 0.01)
        await rep.close()

    asyncio.run(main())
    out = ledger.report()
    assert out["k"]["spent_usd"] == pytest.approx(0.2) and out["k"]["held_usd"] == 0.0
    assert out["plain"]["spent_usd"] == pytest.approx(0.05) and shard.lost == 0
    ledger.flush("k", None, None, 1.0, stream="s", seq=1)  # a stream's first batch...
    ledger.flush("k", None, None, 1.0, stream="s", seq=1)  # ...sent twice
    assert ledger.report()["k"]["spent_usd"] == pytest.approx(1.2)


def test_a_changed_budget_takes_a_new_lease_and_a_hold_past_the_lease_is_held_by_the_ledger_alone():
    ledger, (rep,), shard = replicas(1)
    old, new = key(budget={"usd": 1.0, "window_s": 3600}), key(budget={"usd": 0.5, "window_s": 3600})

    async def main():
        assert (await rep.admit(old, 0.2, "a"))["reason"] is None
        assert (await rep.admit(new, 0.2, "b"))["reason"] is None  # a lease under the new budget (0.25 held by the old)
        assert len({id(lease) for lease in rep.leases}) == 2
        verdict = await rep.rehold(new, "b", 0.5)  # past what the new budget leaves: the ledger's verdict
        assert verdict["over_budget"] and "b" not in rep.tickets
        rep.settle("k", "a", 0.1)
        rep.settle("k", "b", 0.0)
        await rep.close()

    asyncio.run(main())
    assert ledger.report()["k"] == pytest.approx({"spent_usd": 0.1, "held_usd": 0.0, "prompt_tokens": 0,
                                                  "cached_tokens": 0, "cached_share": None})


def test_a_fast_rate_is_leased_and_never_passed_over_two_replicas():
    ledger, (a, b), shard = replicas(2)
    spec = key(requests_per_minute=120)

    async def main():
        oks = 0
        for i in range(300):
            v = await (a if i % 3 else b).admit(spec, 0.0, None)
            oks += v["ok"]
            if not v["ok"]:
                assert v["reason"] == "rate" and v["retry_after_s"] > 0
        for rep in (a, b):
            await rep.close()
        return oks

    oks = asyncio.run(main())
    assert 110 <= oks <= 120 and len(shard.calls) < 80, shard.calls
