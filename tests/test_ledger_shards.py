"""The keys ledger split over shards by key: each key kept whole by one ledger (its budget as exact as one ledger
keeps it), the same shard in every process, and a changed shard count carrying every key's spend over."""
import asyncio
import subprocess
import sys
import time

import pytest

from proxray.serve.tenancy.ledger import is_ledger_of, merged_reports, merged_state, shard_name, shard_of


def test_a_key_has_one_shard_the_same_in_every_process_and_keys_spread_over_them():
    names = [f"team-{i}" for i in range(2000)]
    here = [shard_of(n, 4) for n in names[:50]]
    other = subprocess.run([sys.executable, "-c", "from proxray.serve.tenancy.ledger import shard_of; "
                            f"print([shard_of(f'team-{{i}}', 4) for i in range(50)])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert str(here) == other  # not Python's per-process salted hash
    counts = [sum(1 for n in names if shard_of(n, 4) == s) for s in range(4)]
    assert all(440 <= c <= 560 for c in counts), counts  # 500 each, within ~5 sigma
    assert {shard_of(n, 1) for n in names} == {0}
    assert shard_name("proxray", 0, 1) == "proxray-keys-proxray" and shard_name("proxray", 2, 4) == "proxray-keys-proxray-2of4"
    assert is_ledger_of("proxray", "proxray-keys-proxray-2of4") and is_ledger_of("proxray", "proxray-keys-proxray")
    assert not is_ledger_of("proxray", "proxray-keys-proxray2") and not is_ledger_of("proxray", "proxray-keys-proxray-x")


def test_a_new_layout_takes_each_key_from_the_checkpoint_that_saved_it_last():
    old = {"saved_at": 10.0, "totals": {"a": 1.0, "b": 2.0}, "holds": {"a": {"t": [0.5, 99.0]}}, "tokens": {"b": [5, 1]}}
    new = {"saved_at": 20.0, "totals": {"a": 3.0}}
    got = merged_state([new, old], lambda n: True)
    assert got["totals"] == {"a": 3.0, "b": 2.0} and got["holds"] == {} and got["tokens"] == {"b": [5, 1]}
    assert merged_state([new, old], lambda n: n == "b")["totals"] == {"b": 2.0}
    rep = {"spent_usd": 1.0, "held_usd": 0.0, "prompt_tokens": 0, "cached_tokens": 0, "cached_share": None}
    assert merged_reports([{"a": rep}, {"a": {**rep, "spent_usd": 3.0}}, {"b": rep}])["a"]["spent_usd"] == 3.0


@pytest.mark.slow
def test_sharded_ledgers_keep_each_budget_exact_and_a_new_shard_count_carries_spend_over(fresh_ray):
    """Eight keys with a 1 USD budget over four ledgers (real actors): four admissions at once holding 0.30 each, of
    which exactly three fit; settled at 0.25; then the app's ledgers split over two — every key's spend is carried."""
    import ray

    from proxray.common.shared_actor import CHECKPOINT_EVERY_S, SharedStateDown
    from proxray.serve.tenancy.keys import KeySpec
    from proxray.serve.tenancy.ledger import LedgerClient, running_ledgers

    keys = [KeySpec(name=f"k{i}", sha256="0" * 64, budget={"usd": 1.0, "window_s": 3600.0}) for i in range(8)]

    async def started(client):
        for shard in client.shards:  # each ledger started (a worker each: seconds on a loaded machine)
            for _ in range(5):
                try:
                    await shard.call("report")
                    break
                except SharedStateDown:
                    await asyncio.sleep(1.0)

    async def spend(client):
        await started(client)
        verdicts = await asyncio.gather(*(client.admit(k, 0.30, f"{k.name}-{j}") for k in keys for j in range(4)))
        for k in keys:
            for j in range(4):
                client.settle(k.name, f"{k.name}-{j}", 0.25)
        await asyncio.gather(*(t for s in client.shards for t in list(s.background)))  # the settles delivered
        return verdicts

    async def seen(client):
        await started(client)
        return [(await client.admit(k, 0.0, f"{k.name}-probe"))["spent_usd"] for k in keys]

    four = LedgerClient("shards", 4)
    verdicts = asyncio.run(spend(four))
    for i, k in enumerate(keys):  # per key, in any order: three within the budget, one past it
        assert sorted(str(v["reason"]) for v in verdicts[4 * i:4 * i + 4]) == ["None", "None", "None", "over_budget"]
    assert running_ledgers("shards") == [f"proxray-keys-shards-{s}of4" for s in range(4)]
    reports = [ray.get(ray.get_actor(f"proxray-keys-shards-{s}of4", namespace="proxray").report.remote()) for s in range(4)]
    assert sorted(n for r in reports for n in r) == sorted(k.name for k in keys)  # each key in one ledger only
    assert all(shard_of(n, 4) == s for s, r in enumerate(reports) for n in r)
    assert merged_reports(reports)["k3"]["spent_usd"] == pytest.approx(1.0)
    time.sleep(CHECKPOINT_EVERY_S + 0.1)
    assert asyncio.run(seen(four)) == pytest.approx([1.0] * 8)  # these admissions write each ledger's checkpoint
    two = LedgerClient("shards", 2)
    assert asyncio.run(seen(two)) == pytest.approx([1.0] * 8)  # the new layout started from the old one's
    assert len(running_ledgers("shards")) == 6


@pytest.mark.slow
def test_a_ledger_answers_while_its_checkpoint_store_does_not(monkeypatch):
    """The GCS away (a head restarting): the ledger's key-value store blocks. Admissions and charges answer from
    memory at once; the newest state is written when the store takes it again, and nothing older after it."""
    import json
    import threading

    from ray.experimental import internal_kv

    from proxray.serve.tenancy.keys import KeyLedger

    store, gate, calls = {}, threading.Event(), []

    def put(key, value, overwrite=True, namespace=None):
        calls.append(time.monotonic())
        if not gate.wait(timeout=30):
            raise TimeoutError("the GCS did not come back")
        store[key] = value

    monkeypatch.setattr(internal_kv, "_internal_kv_initialized", lambda: True)
    monkeypatch.setattr(internal_kv, "_internal_kv_get", lambda key, namespace=None: store.get(key))
    monkeypatch.setattr(internal_kv, "_internal_kv_put", put)
    monkeypatch.setattr("proxray.common.shared_actor.CHECKPOINT_EVERY_S", 0.0)
    ledger = KeyLedger("proxray-keys-test")
    budget = {"usd": 1.0, "window_s": 3600.0, "over_budget": "reject"}
    t0 = time.monotonic()
    for i in range(50):  # every change asks for a checkpoint; the first write is stuck in the store
        assert ledger.admit("k", None, budget, 0.01, f"t{i}")["ok"]
        ledger.settle("k", f"t{i}", 0.01)
    assert time.monotonic() - t0 < 2.0  # answered from memory
    while not calls and time.monotonic() < t0 + 10:
        time.sleep(0.01)
    assert len(calls) == 1  # one write in flight, stuck in the store
    gate.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and \
            abs(json.loads(store.get("proxray-keys-test", "{}")).get("totals", {}).get("k", 0.0) - 0.5) > 1e-9:
        time.sleep(0.05)  # a sum of fifty 0.01s: 0.5 to within rounding
    assert json.loads(store["proxray-keys-test"])["totals"] == pytest.approx({"k": 0.5})  # the newest state
    assert len(calls) <= 3  # not a write per change: the newest waiting state replaces the older ones
    assert KeyLedger("proxray-keys-test").report()["k"]["spent_usd"] == pytest.approx(0.5)  # a restart starts from it
