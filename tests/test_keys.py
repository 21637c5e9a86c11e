"""API keys with their own policy (proxray.serve.keys): the keys file (hashes only, validated, read again when it
changes), the shared ledger's rate and budget windows, `proxray keys new`. Over HTTP: tests/test_serve.py."""
import os
import stat

import pytest

from proxray.serve import keys as keys_mod
from proxray.serve.keys import KeyLedger, KeyRing, key_hash, new_key_entry, read_keys


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
    led.charge("k", 0.6, now=0)
    led.charge("k", 0.5, now=50)
    assert led.admit("k", None, budget, now=60)["reason"] == "over_budget"  # 1.1 spent in the window
    verdict = led.admit("k", None, budget, now=120)  # the first charge left the window
    assert verdict["reason"] is None and verdict["spent_usd"] == pytest.approx(0.5)
