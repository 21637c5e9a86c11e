"""API keys with their own policy (proxray.serve.tenancy.keys): the keys file (hashes only, validated, read again when it
changes), the shared ledger's rate and budget windows, `proxray keys new`. Over HTTP: tests/test_serve.py."""
import os
import stat

import pytest

from proxray.serve.tenancy import keys as keys_mod
from proxray.serve.tenancy.keys import KeyLedger, KeyRing, key_hash, new_key_entry, read_keys


def test_a_new_key_is_printed_once_and_stored_as_its_hash(tmp_path, capsys):
    from proxray.cli import main

    path = tmp_path / "keys.yaml"
    assert main(["keys", "new", "--file", str(path), "--name", "team-a", "--models", "m1,m2", "--rpm", "60",
                 "--budget-usd", "5", "--over-budget", "cheapest"]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("sk-proxray-") and len(key) > 40
    text = path.read_text()
    assert key not in text and key_hash(key) in text and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    spec = read_keys(path).keys[0]
    assert (spec.name, spec.allowed_models, spec.requests_per_minute) == ("team-a", ["m1", "m2"], 60)
    assert spec.budget.usd == 5 and spec.budget.over_budget == "cheapest"
    with pytest.raises(ValueError, match="name must be unique"):
        new_key_entry(path, "team-a")


def test_the_ring_knows_keys_by_hash_and_rereads_the_file(tmp_path, monkeypatch):
    path = tmp_path / "keys.yaml"
    a = new_key_entry(path, "a", lam=10.0)
    ring = KeyRing(str(path))
    assert ring.identify(a).name == "a" and ring.identify("sk-wrong") is None
    b = new_key_entry(path, "b")
    monkeypatch.setattr(keys_mod, "RELOAD_EVERY_S", 0.0)
    assert ring.identify(b).name == "b"  # no restart
    path.write_text("keys: [{name: c, sha256: nothex}]")  # an edit gone wrong keeps the keys read before
    os.utime(path, ns=(1, 1))
    assert ring.identify(a).name == "a"
    with pytest.raises(ValueError, match="sha256"):
        read_keys(path)


def test_the_ledger_keeps_rate_and_budget_windows():
    led = KeyLedger()
    budget = {"usd": 1.0, "window_s": 100.0}
    assert [led.admit("k", 2, None, now=t)["ok"] for t in (0, 1, 2)] == [True, True, False]
    refused = led.admit("k", 2, None, now=30)
    assert refused["reason"] == "rate" and refused["retry_after_s"] == pytest.approx(30.0)
    assert led.admit("k", 2, None, now=61)["ok"]  # the first start left the minute
    assert led.admit("k", None, budget, now=0)["reason"] is None  # a budget's window starts with its first request
    led.charge("k", 0.6, now=0)
    led.charge("k", 0.5, now=50)
    assert led.admit("k", None, budget, now=60)["reason"] == "over_budget"  # 1.1 spent in the window
    verdict = led.admit("k", None, budget, now=120)  # the first charge left the window
    assert verdict["reason"] is None and verdict["spent_usd"] == pytest.approx(0.5)


def test_holds_keep_concurrent_requests_within_the_budget_and_settle_to_the_real_cost():
    """40 requests admitted at once on a budget of 5 answers, each holding its upper bound: 5 are let through at
    the budget, the rest are over it; each settles to what its answer cost (less than its hold), and a hold whose
    replica never settled it is charged in full when its time is up."""
    from proxray.serve.tenancy.keys import HOLD_TTL_S

    led, budget = KeyLedger(), {"usd": 5.0, "window_s": 3600.0}
    verdicts = [led.admit("k", None, budget, hold_usd=1.0, ticket=f"t{i}", now=10.0) for i in range(40)]
    assert [v["reason"] for v in verdicts] == [None] * 5 + ["over_budget"] * 35
    for i in range(5, 40):
        led.settle("k", f"t{i}", 0.0, now=11.0)  # refused: nothing spent
    for i in range(5):
        led.settle("k", f"t{i}", 0.8, now=12.0)
    assert led.admit("k", None, budget, now=13.0)["spent_usd"] == pytest.approx(4.0)
    led.admit("k", None, budget, hold_usd=0.9, ticket="lost", now=14.0)
    assert led.admit("k", None, budget, now=15.0)["spent_usd"] == pytest.approx(4.9)  # held counts as spent
    assert led.admit("k", None, budget, now=14.0 + HOLD_TTL_S)["spent_usd"] == pytest.approx(4.9)  # charged in full
    assert led.holds["k"] == {}


def test_a_hold_taken_before_the_plan_moves_to_the_chosen_models():
    """Admission holds the request as sent at the dearest model it may reach; once planned the hold moves to the chosen
    model's bound: lowered, the budget has room again; raised past the budget (a stored history the body did not
    carry), the verdict says so, and no other key's books move."""
    led, budget = KeyLedger(), {"usd": 1.0, "window_s": 3600.0}
    assert led.admit("k", None, budget, hold_usd=0.9, ticket="a", now=1.0)["reason"] is None
    assert led.admit("k", None, budget, hold_usd=0.9, ticket="b", now=1.0)["reason"] == "over_budget"
    led.settle("k", "b", 0.0, now=1.0)  # refused
    assert led.rehold("k", budget, "a", 0.1, now=2.0) == {"over_budget": False, "spent_usd": pytest.approx(0.1)}
    assert led.admit("k", None, budget, hold_usd=0.5, ticket="c", now=3.0)["reason"] is None  # room again
    v = led.rehold("k", budget, "c", 2.0, now=4.0)
    assert v["over_budget"] and v["spent_usd"] == pytest.approx(2.1)
    led.settle("k", "c", 0.0, now=5.0)
    led.rehold("k", budget, "gone", 9.0, now=5.0)  # a settled ticket is not held again
    assert led.report()["k"] == {"spent_usd": 0.0, "held_usd": pytest.approx(0.1), "prompt_tokens": 0, "cached_tokens": 0,
                                 "cached_share": None} and "other" not in led.report()


def test_admission_costs_the_same_after_a_day_of_traffic():
    """A key's memory is bounded whatever its traffic: the rate's starts of the last minute and the budget's 60
    buckets (its spend leaves the window in steps of a sixtieth of it)."""
    from proxray.serve.tenancy.keys import BUCKETS

    led, budget = KeyLedger(), {"usd": 1e9, "window_s": 86400.0}
    for i in range(28_800):  # a day at one request every 3 s
        now = 3.0 * i
        assert led.admit("k", 600, budget, hold_usd=1e-3, ticket=str(i), now=now)["ok"]
        led.settle("k", str(i), 1e-3, now=now)
    assert len(led.starts["k"]) == 20 and len(led.windows["k"].sums) == BUCKETS and led.holds["k"] == {}
    assert led.admit("k", 600, budget, now=86400.0)["spent_usd"] == pytest.approx(28.8, rel=0.02)
    assert led.admit("k", 600, budget, now=2 * 86400.0)["spent_usd"] == 0.0


def test_the_ledger_reports_each_keys_cached_share():
    led, budget = KeyLedger(), {"usd": 10.0, "window_s": 3600.0}
    led.admit("k", None, budget, hold_usd=0.5, ticket="a", now=1.0)
    led.settle("k", "a", 0.01, now=2.0, tokens=(10_000, 9_000))  # a turn whose prefix the provider had cached
    led.charge("k", 0.02, now=3.0, tokens=(5_000, 0))  # a key without a budget: charged, not held
    assert led.report()["k"] == {"spent_usd": pytest.approx(0.03), "held_usd": 0.0, "prompt_tokens": 15_000,
                                 "cached_tokens": 9_000, "cached_share": 0.6}
    again = KeyLedger()
    again._load(led._state())  # the checkpoint keeps it
    assert again.report()["k"]["cached_share"] == 0.6
