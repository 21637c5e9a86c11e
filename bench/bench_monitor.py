"""Cost of the monitor's bookkeeping (not a timed test): ``report()`` with a full drift queue, and one
snapshot. Today a report appends one journal line; the snapshot (on the scheduler's clock) writes it all.

    python bench/bench_monitor.py [--queue 4000] [--json out/bench_monitor.json]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None):
    from proxray import KNNRouter
    from proxray.demos.drift import POOL, job_template
    from proxray.embeddings.encoder import SentenceEncoder
    from proxray.monitor import DriftMonitor
    from proxray.pool.simulated import make_table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queue", type=int, default=4000)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="proxray-bench-monitor-"))
    table = make_table(30)
    table.write(tmp / "t.parquet")
    enc = SentenceEncoder(progress=False)
    X = enc.encode(table.prompts)
    acc, cost = table.matrices(models=POOL)
    KNNRouter(k=30).fit(X, acc, cost, models=POOL, encoder_id=enc.id).save(tmp / "r")
    mon = DriftMonitor({"router": str(tmp / "r"), "table": str(tmp / "t.parquet"), "state_dir": str(tmp / "s"),
                        "job": job_template(), "max_buffer": a.queue + 10, "window": 500, "shadow_rate": 0.1,
                        "submit": "inline"}, encoder=enc)
    rng = np.random.default_rng(0)
    x = rng.normal(size=384).astype(np.float32)
    times = []
    for i in range(a.queue):
        t0 = time.perf_counter()
        mon.report(f"a drifted query number {i} " + "words " * 40, x, 10.0)
        times.append(time.perf_counter() - t0)
    last = np.array(times[-500:]) * 1e3
    t0 = time.perf_counter()
    with mon.lock:
        mon._snapshot()
    snap_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    DriftMonitor(mon.config, encoder=enc)  # restore: snapshot + (empty) journal
    restore_s = time.perf_counter() - t0
    res = {"queue": len(mon.book.drift_queue), "report_ms_p50": round(float(np.median(last)), 3),
           "report_ms_p99": round(float(np.quantile(last, 0.99)), 3), "snapshot_ms": round(snap_ms, 1),
           "snapshot_bytes": (tmp / "s" / "monitor_state.json").stat().st_size, "restore_s": round(restore_s, 2)}
    from report import emit

    emit(res, a.json)


if __name__ == "__main__":
    main()
