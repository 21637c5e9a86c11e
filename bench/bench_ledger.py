"""What a key's admission costs, fresh and after a day of traffic (not a timed test).

    python bench/bench_ledger.py [--admissions 5000] [--day 28800]

The keys ledger (proxray.serve.tenancy.keys.KeyLedger) as the named actor every ingress replica asks, on a local Ray: the time
of ``--admissions`` admissions of a key with a rate and a budget (each holding its cost, then settled, as the gateway
does), first on a fresh ledger, then once a day's window holds ``--day`` requests of that key; admissions a second and
per admission, and the ledger's own work per admission (in process, without Ray). A key's cost must not grow with its
traffic.
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # the benchmark's own local cluster

RPM, BUDGET = 1e9, {"usd": 1e9, "window_s": 86400.0, "over_budget": "reject"}


def rounds(ledger, n: int, start: float, step: float, call) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        now = start + step * i
        call(ledger.admit, "k", RPM, BUDGET, 1e-3, f"{start}-{i}", now)
        call(ledger.settle, "k", f"{start}-{i}", 1e-3, now)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--admissions", type=int, default=5000)
    p.add_argument("--day", type=int, default=28_800)
    a = p.parse_args(argv)

    import ray

    from proxray.serve.tenancy.keys import KeyLedger

    out = {}
    local = KeyLedger()
    direct = lambda f, *args: f(*args)  # noqa: E731
    out["in_process_fresh_us"] = 1e6 * rounds(local, a.admissions, 0.0, 1e-3, direct) / a.admissions
    rounds(local, a.day, 10.0, 86400.0 / a.day, direct)
    out["in_process_after_day_us"] = 1e6 * rounds(local, a.admissions, 86400.0, 1e-3, direct) / a.admissions

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(KeyLedger).options(num_cpus=0).remote()
        remote = lambda f, *args: ray.get(f.remote(*args))  # noqa: E731
        fresh = rounds(actor, a.admissions, 0.0, 1e-3, remote)
        for i in range(0, a.day, 1000):  # the day's traffic, in batches
            ray.get([actor.admit.remote("k", RPM, BUDGET, 1e-3, f"d{j}", 10.0 + 86400.0 * j / a.day)
                     for j in range(i, min(i + 1000, a.day))])
            ray.get([actor.settle.remote("k", f"d{j}", 1e-3, 10.0 + 86400.0 * j / a.day)
                     for j in range(i, min(i + 1000, a.day))])
        after = rounds(actor, a.admissions, 86400.0, 1e-3, remote)
    finally:
        ray.shutdown()
    out.update({"admissions": a.admissions, "day_requests": a.day,
                "actor_fresh_s": round(fresh, 3), "actor_after_day_s": round(after, 3),
                "actor_fresh_per_admission_ms": round(1e3 * fresh / a.admissions, 3),
                "actor_after_day_per_admission_ms": round(1e3 * after / a.admissions, 3),
                "actor_admissions_per_s_after_day": round(a.admissions / after, 1)})
    out["in_process_fresh_us"] = round(out["in_process_fresh_us"], 2)
    out["in_process_after_day_us"] = round(out["in_process_after_day_us"], 2)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
