"""``proxray serve`` started and stopped again and again: is it ready when it says so (not a timed test).

    python bench/bench_serve_starts.py [--config serve_configs/cpu_vllm.yaml] [--starts 5] [--model tiny-llama-a]
                                       [--stop term-group|int-group|term] [--json out/serve_starts.json]

Each start: ``proxray serve --config CONFIG`` in a process group of its own; ``GET /health`` every 0.5 s until it says
200 (what it said before is counted: 503 ``starting``, or no answer); then the model named by ``--model`` asked by
name, whole and streamed, at once; then the stop (SIGTERM or SIGINT to the whole group, or SIGTERM to the process) and
whether port 8000 is free once it exited. The config's router and model folders must exist (the config's header says
how to build them). Local only: 127.0.0.1, Ray's token auth off for the cluster it starts.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BASE = "http://127.0.0.1:8000"


def port_free(port: int = 8000) -> bool:
    """Whether nothing listens on ``port`` (no HAProxy or proxy left), as a local cluster's ports are judged."""
    from proxray.serve.front import nothing_listens

    return nothing_listens()(port)


def one_start(config: str, model: str, stop: str, ready_s: float) -> dict:
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    proxray = str(Path(sys.executable).with_name("proxray"))
    proc = subprocess.Popen([proxray, "serve", "--config", config], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0, seen, out = time.monotonic(), {}, {"health": None}
    try:
        while time.monotonic() - t0 < ready_s and proc.poll() is None:
            try:
                code = httpx.get(f"{BASE}/health", timeout=5).status_code
            except httpx.HTTPError:
                code = 0
            seen[code] = seen.get(code, 0) + 1
            if code == 200:
                out["health"] = round(time.monotonic() - t0, 1)
                break
            time.sleep(0.5)
        out["before_200"] = {str(k): v for k, v in seen.items() if k != 200}
        if out["health"] is not None:
            body = {"model": model, "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 8}
            r = httpx.post(f"{BASE}/v1/chat/completions", json=body, timeout=300)
            out["whole"] = r.status_code
            with httpx.stream("POST", f"{BASE}/v1/chat/completions", json={**body, "stream": True}, timeout=300) as s:
                text = "".join(s.iter_text())
            out["streamed"] = s.status_code if "[DONE]" in text else f"{s.status_code}, no [DONE]"
    finally:
        sig = signal.SIGINT if stop == "int-group" else signal.SIGTERM
        try:
            os.killpg(proc.pid, sig) if stop.endswith("group") else proc.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out["exit"] = proc.returncode
        out["port_free"] = port_free()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="serve_configs/cpu_vllm.yaml")
    p.add_argument("--model", default="tiny-llama-a")
    p.add_argument("--starts", type=int, default=5)
    p.add_argument("--stop", choices=["term-group", "int-group", "term"], default="term-group")
    p.add_argument("--ready-s", type=float, default=600.0, help="how long a start may take to say 200")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if not port_free():
        raise SystemExit("port 8000 is taken: stop what holds it first")
    runs = []
    for i in range(a.starts):
        run = one_start(a.config, a.model, a.stop, a.ready_s)
        runs.append(run)
        print(json.dumps({"start": i + 1, **run}), flush=True)
    good = sum(r.get("whole") == 200 and r.get("streamed") == 200 and r["port_free"] for r in runs)
    summary = {"config": a.config, "model": a.model, "stop": a.stop, "answered_and_stopped_clean": f"{good} of {len(runs)}",
               "runs": runs}
    print(f"{good} of {len(runs)} starts: /health 200, then {a.model} answered whole and streamed, port free after")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if good == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
