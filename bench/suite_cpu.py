"""Where a run's CPU goes, process by process: a sampler beside the run (the suite's, a benchmark's) and its report.

    python bench/suite_cpu.py sample cpu.json --until /tmp/run-ended   # beside the run; ends once the file exists
    python bench/suite_cpu.py report cpu.json                          # core-seconds by kind of process

Every second the sampler reads each process's own CPU time (``/proc/<pid>/stat``: user + system) and its command
line; what a process had spent before the first sample is left out. A Ray worker's time goes to the name it has
while it spends it (``ray::IDLE``, ``ray::ServeReplica:…``, ``ray::ShardedKeyLedger``): its command line is read
again at each sample. A process that lives under a second may
be missed, and the time a process spends after its last sample is; the report says how many processes it saw."""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import time
from pathlib import Path

# the first that a command line holds names its kind (vLLM's engine processes are multiprocessing's spawns)
KINDS = ("multiprocessing.spawn", "default_worker.py", "gcs_server", "raylet", "dashboard/agent", "dashboard.py",
         "log_monitor", "runtime_env/agent", "haproxy", "monitor.py", "-m pytest", "-m pip", "compileall", "npm", "codex",
         "proxray")


def _cmdline(pid: str) -> str | None:
    try:
        parts = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return " ".join(p.decode(errors="replace") for p in parts if p)[:300] or None


def sample(out: Path, until: Path, every_s: float = 1.0) -> None:
    hz = os.sysconf("SC_CLK_TCK")
    seen: dict = {}  # "pid:start" -> {"cpu": last, "by_name": {name: seconds}, "name": current}
    first = True  # what a process had spent before the first sample is not the run's
    while not until.exists():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            rest = stat[stat.rfind(")") + 2:].split()
            cpu, key = (int(rest[11]) + int(rest[12])) / hz, f"{pid}:{rest[19]}"
            entry = seen.get(key)
            if entry is None or entry["name"].startswith("ray::") or "default_worker" in entry["name"]:
                name = _cmdline(pid) or (entry or {}).get("name")
                if name is None:
                    continue
                entry = seen.setdefault(key, {"cpu": cpu if first else 0.0, "by_name": {}, "name": name})
                entry["name"] = name
            by = entry["by_name"]
            by[entry["name"]] = by.get(entry["name"], 0.0) + cpu - entry["cpu"]
            entry["cpu"] = cpu
        first = False
        time.sleep(every_s)
    out.write_text(json.dumps({k: v["by_name"] for k, v in seen.items()}))


def kind(name: str) -> str:
    if name.startswith("ray::"):
        m = re.match(r"ray::ServeReplica:[^:]+:(\S+)", name)
        return f"replica {m.group(1)}" if m else re.match(r"ray::[\w.-]+", name).group(0)
    return next((k for k in KINDS if k in name), name.split()[0].rsplit("/", 1)[-1][:40])


def report(path: Path, top: int = 30) -> None:
    seen = json.loads(path.read_text())
    by, count = collections.Counter(), collections.Counter()
    for names in seen.values():
        for name, seconds in names.items():
            by[kind(name)] += seconds
        for k in {kind(n) for n in names}:
            count[k] += 1
    total = sum(by.values())
    print(f"{total:,.0f} core-seconds in {len(seen):,} processes")
    for k, v in by.most_common(top):
        print(f"{v:9.1f} {100 * v / total:5.1f} %  {count[k]:5d} processes  {k}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sample")
    s.add_argument("out", type=Path)
    s.add_argument("--until", type=Path, required=True, help="stop (and write OUT) once this file exists")
    r = sub.add_parser("report")
    r.add_argument("path", type=Path)
    r.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    sample(a.out, a.until) if a.what == "sample" else report(a.path, a.top)
