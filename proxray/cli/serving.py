"""``proxray keys``, ``serve``, ``check``, ``monitor`` and ``demo``: the served endpoint and what runs beside it."""
from __future__ import annotations

import argparse
import os
import sys


def _cmd_keys(a):
    if a.what == "report":
        return _keys_report(a)
    if not a.file or not a.name:
        raise SystemExit("proxray keys new: --file and --name are required")
    from proxray.serve.tenancy.keys import new_key_entry

    budget = None
    if a.budget_usd is not None:
        budget = {"usd": a.budget_usd, "window_s": a.budget_window_s, "over_budget": a.over_budget}
    key = new_key_entry(a.file, a.name, lam=a.lam, allowed_models=a.models,
                        requests_per_minute=a.rpm, budget=budget, feedback=a.feedback)
    print(f"added key {a.name!r} to {a.file} (its hash; ingress replicas pick it up within seconds). The key, shown "
          "this once:", file=sys.stderr)
    print(key)


def _keys_report(a):
    """What the running app's keys ledger knows of each key: USD spent and held, its answers' prompt tokens and the
    share its providers read from their prompt cache (JSON on standard output)."""
    import json

    import ray

    from proxray.common.actors import NAMESPACE, ActorDown, call, find
    from proxray.serve.tenancy.ledger import merged_reports, running_ledgers

    ray.init(address=a.address, namespace=NAMESPACE, log_to_driver=False)
    try:
        names = running_ledgers(a.app)
        if not names:
            raise SystemExit(f"no keys ledger of the app {a.app!r} is running (proxray-keys-{a.app}: has it a "
                             "keys_file and answered a keyed request?)")
        reports = []
        for name in names:
            actor = find(name)
            try:
                reports.append(call(actor, name, "report", timeout_s=30) if actor is not None else {})
            except ActorDown as e:
                raise SystemExit(f"keys ledger {name!r} did not answer: {e.why}") from None
        print(json.dumps(merged_reports(reports), indent=2, sort_keys=True))
    finally:
        ray.shutdown()


def _cmd_gcs_clean(a):
    from proxray.common.gcs_storage import clean, env_file_values

    env = {**{k: v for k, v in os.environ.items() if k.startswith("RAY_")}, **env_file_values(a.env_file)}
    if not env.get("RAY_REDIS_ADDRESS"):
        print(f"proxray gcs-clean: no RAY_REDIS_ADDRESS (in the environment or {a.env_file}): the GCS kept its tables "
              "on the head, nothing to remove")
        return 0
    print(f"proxray gcs-clean: removed namespace {clean(env)} from the external Redis")
    return 0


def _cmd_check(a):
    from proxray.check import check

    reports = [check(path, a.address, a.simulate) for path in a.config]
    print("\n".join(r.text() for r in reports))
    return 0 if all(r.ok for r in reports) else 2


def _cmd_serve(a):
    """``proxray check``'s checks first (a problem stops it before anything starts), then ``serve run``; with
    ``--simulate`` the config's rehearsal, written to a temp folder of its own that goes when the run ends."""
    import contextlib
    import tempfile

    with tempfile.TemporaryDirectory(prefix="proxray-rehearsal-") if a.simulate else contextlib.nullcontext() as into:
        raise SystemExit(run_supervised(*_serve_run(a.config, into)))


def _serve_run(config: str, rehearsal_in: str | None = None) -> tuple:
    """The ``serve run`` command of ``config`` and its environment, once ``proxray check`` passed it; ``rehearsal_in``:
    a folder to write the config's rehearsal to (``--simulate``) and run that instead."""
    import yaml

    from proxray.check import check, simulated_serve_config
    from proxray.serve.front import front_env

    if rehearsal_in is not None:
        raw = yaml.safe_load(open(config))
        config = os.path.join(rehearsal_in, os.path.basename(config))
        with open(config, "w") as f:
            yaml.safe_dump(simulated_serve_config(raw), f, sort_keys=False)
    report = check(config)
    print(report.text(), file=sys.stderr)
    if not report.ok:
        raise SystemExit(2)
    serve_bin = os.path.join(os.path.dirname(sys.executable), "serve")
    # Ray's token auth stays as configured (on by default in Ray 2.60: the local cluster makes a token); a local
    # cluster it starts puts Serve's HAProxy ingress in front, on ports no other Serve here holds
    # (proxray.serve.front); a running one keeps its own
    return [serve_bin, "run", config], {**os.environ, **front_env(local=True)}


STOP_GRACE_S = 30.0  # how long ``serve run`` may take to stop Serve and its local Ray before what is left is killed
SUPERVISED = "PROXRAY_SUPERVISED"  # in a supervised process's environment, and so in every process started under it


def run_supervised(cmd: list, env: dict | None = None) -> int:
    """``cmd`` in a child process under ``supervise``, marked: its environment names it (``SUPERVISED``), as does the
    environment of every process started under it — Ray's, its workers', Serve's HAProxy — wherever it is re-parented."""
    return supervise(*start_marked(cmd, env))


def start_marked(cmd: list, env: dict | None = None, out=None) -> tuple:
    """``cmd`` started in a child process marked as ``run_supervised`` marks it (``out``: its output, default ours);
    returns the child and its mark."""
    import subprocess

    marker = f"{os.getpid()}-{os.urandom(6).hex()}"
    child = subprocess.Popen(cmd, env={**(os.environ if env is None else env), SUPERVISED: marker}, stdout=out,
                             stderr=subprocess.STDOUT if out is not None else None)
    return child, marker


def marked(marker: str) -> dict:
    """Every process whose environment carries ``SUPERVISED=marker``, with when it started (none without /proc)."""
    needle = f"{SUPERVISED}={marker}".encode()
    found = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found[int(entry)] = _stat(entry)[19]
            except (OSError, IndexError):
                continue
    return found


def _stat(pid) -> list:
    """The fields of ``/proc/<pid>/stat`` after the command's name: [state, parent, …, start time (index 19), …]."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def supervise(child, marker: str) -> int:
    """Wait for ``serve run`` (or a demo) started marked by ``run_supervised``; stopped by SIGTERM (a supervisor, to
    this process or its whole process group) or SIGINT (Ctrl-C), stop it and leave nothing behind: ``serve run`` is
    told to stop (SIGTERM: it shuts Serve and the local Ray down), and every process whose environment carries
    ``marker`` that still runs after it is ended — Serve's HAProxy above all, re-parented to init once its parent is
    gone (a group signal may end that parent first) or reloaded while the stop went on, holding the HTTP port and its
    stats and metrics ports — so the next ``proxray serve`` binds the same ports. Returns 0 for a stop asked for, else
    ``serve run``'s own status."""
    import signal
    import time

    asked: list = []

    def stop(signum, _frame):
        asked.append(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while child.poll() is None and not asked:
            time.sleep(0.2)
        if not asked:
            return child.returncode
        stop_marked(child, marker)
        return 0
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def stop_marked(child, marker: str) -> None:
    """``serve run`` (or a demo) told to stop (SIGTERM), killed if it does not within ``STOP_GRACE_S``, then every
    process still carrying its mark ended."""
    import signal

    print("proxray serve: stopping Serve and its local Ray", file=sys.stderr)
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(STOP_GRACE_S)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: it did not stop in time
        child.kill()
        child.wait()
    _end(marked(marker))
    _end(marked(marker))  # one started while the others stopped


def _end(procs: dict, grace_s: float = 5.0) -> None:
    """SIGTERM to each of ``procs`` ({pid: when it started}) still running, then SIGKILL to those still running after
    ``grace_s``."""
    import signal
    import time

    def alive(pid):
        try:
            fields = _stat(pid)
        except (OSError, IndexError):
            return False
        # a zombie waiting for its parent is gone for our purpose; another process given the pid since is not ours
        return fields[0] != "Z" and fields[19] == procs[pid]

    left = [p for p in procs if alive(p)]
    for p in left:
        try:
            os.kill(p, signal.SIGTERM)
        except OSError:
            pass
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(alive(p) for p in left):
        time.sleep(0.1)
    for p in left:
        if alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def _cmd_demo(a):
    """The drift demo in a child process under ``supervise``: the demo starts a local Ray and Serve (with Serve's
    HAProxy) in its own process, which a SIGTERM ends without its cleanup; stopped by SIGTERM or Ctrl-C, every process
    below it is ended too, so no HAProxy outlives it and its ports are free for the next run. The serve demo:
    ``_demo_serve``."""
    if a.name == "serve":
        raise SystemExit(_demo_serve(a.rest))
    if any(x in ("-h", "--help") for x in a.rest):
        from proxray.demos.drift import main as drift_main

        raise SystemExit(drift_main(a.rest))
    raise SystemExit(run_supervised([sys.executable, "-m", "proxray.demos.drift", *a.rest]))


def _demo_serve(argv: list) -> int:
    """``proxray demo serve``: the config's router fitted where it is missing, ``proxray serve`` of the config
    (checked, supervised, its output in a log), ``/health`` waited for, one question asked and its answer and routing
    report printed; then stopped, or kept serving until SIGTERM or Ctrl-C (``--keep``)."""
    import time

    import yaml

    from proxray.demos.serve import ask, base_url, describe, ensure_router, healthy

    p = argparse.ArgumentParser(prog="proxray demo serve", description="A routed answer in one command: fit the "
                                "router where it is missing, serve the config, ask it, print who answered and why.")
    p.add_argument("--config", default="serve_configs/cpu_demo.yaml", help="Serve YAML (default: the CPU demo's)")
    p.add_argument("--question", default=None, help="what to ask (default: a small sum)")
    p.add_argument("--keep", action="store_true", help="keep serving after the answer, until SIGTERM or Ctrl-C")
    p.add_argument("--log", default="out/demo/serve.log", help="where Serve's own output goes")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health to say 200")
    a = p.parse_args(argv)
    if not os.path.isfile(a.config):
        raise SystemExit(f"proxray demo serve: --config {a.config}: no such file (run it from the repository's folder, "
                         "or name a Serve YAML)")
    config = yaml.safe_load(open(a.config))
    print(ensure_router(config), file=sys.stderr)
    url = base_url(config)
    cmd, env = _serve_run(a.config)
    os.makedirs(os.path.dirname(a.log) or ".", exist_ok=True)
    log = open(a.log, "w")
    print(f"starting {a.config} at {url} (Serve's output: {a.log})", file=sys.stderr)
    child, marker = start_marked(cmd, env, out=log)
    try:
        end = time.monotonic() + a.timeout
        while True:
            if child.poll() is not None:
                raise SystemExit(f"proxray demo serve: serve run exited with {child.returncode} before it answered "
                                 f"(see {a.log})")
            if healthy(url):
                break
            if time.monotonic() > end:
                raise SystemExit(f"proxray demo serve: {url}/health not 200 after {a.timeout:.0f} s (see {a.log})")
            time.sleep(1.0)
        print(describe(ask(url, *([a.question] if a.question else []))))
        if a.keep:
            print(f"serving at {url}/v1 (any OpenAI client; `proxray serve --config {a.config}` does the same); "
                  "Ctrl-C stops it", file=sys.stderr)
            return supervise(child, marker)
        print(f"to keep it serving: proxray demo serve --keep, or proxray serve --config {a.config}", file=sys.stderr)
    finally:
        if child.poll() is None:
            stop_marked(child, marker)
        log.close()
    return 0


def _cmd_monitor(a):
    """start: validate the config, start the detached monitor actor (its scheduler runs by itself) next to
    the running Serve app, print its status. status / metrics / stop: the running one, by name. Standard output
    holds the result only (JSON, or Prometheus text): what Ray prints to a driver's stdout (the raylet's warnings,
    pushed to every driver) goes to standard error meanwhile, up to and including Ray's disconnect, which prints
    the messages its deduplicator still holds."""
    import sys

    out, sys.stdout = sys.stdout, sys.stderr
    try:
        _monitor_command(a, out)
    finally:
        import ray

        try:
            ray.shutdown()  # here, not at exit: its leftovers would reach the restored stdout
        finally:
            sys.stdout = out


def _monitor_command(a, out):
    import json

    import ray

    from proxray.common.actors import NAMESPACE, ActorDown, call
    from proxray.monitor.actor import get_monitor, start_monitor, stop_monitor

    name = a.name
    cfg = None
    if a.config:
        from proxray.monitor.config import load_monitor_config

        cfg = load_monitor_config(a.config)  # before Ray: a bad config fails here, not inside an actor
        if a.simulate:
            from proxray.monitor.config import rehearsal

            cfg = rehearsal(cfg)
        name = name or cfg.name
    name = name or "proxray-monitor"
    if a.what == "start" and cfg is None:
        raise ValueError("proxray monitor start needs --config monitor.yaml")
    ray.init(address=a.address, namespace=NAMESPACE, log_to_driver=False)
    if a.what == "start":
        actor = start_monitor(cfg, name=name)
        try:  # the constructor encodes the training table: wait until it answers
            status = call(actor, name, "status", timeout_s=a.timeout)
        except ActorDown as e:
            raise SystemExit(f"monitor {name!r} did not answer: {e.why}") from None
        print(json.dumps(status, indent=2, default=str), file=out)
        return
    if a.what == "stop":
        print(json.dumps({"stopped": stop_monitor(name), "name": name}), file=out)
        return
    actor = get_monitor(name)
    if actor is None:
        raise SystemExit(f"no monitor named {name!r} is running (namespace {NAMESPACE})")
    try:
        if a.what == "metrics":
            print(call(actor, name, "prometheus", timeout_s=a.timeout), end="", file=out)
            return
        args = (a.to,) if a.what == "rollback" else ()
        shown = call(actor, name, a.what, *args, timeout_s=a.timeout)  # status, versions, rollback
        print(json.dumps(shown, indent=2, default=str), file=out)
    except ActorDown as e:
        raise SystemExit(f"monitor {name!r} did not answer: {e.why}") from None
    except ray.exceptions.RayTaskError as e:  # a rollback the monitor refused: its reason
        raise SystemExit(f"monitor {name!r}: {e.cause}") from None


def add_serving(sub) -> None:
    from proxray.common.cliargs import comma_list, flag_with_old_positional

    keys = sub.add_parser("keys", help="API keys with their own policy: `new` adds one to a keys file (the app's "
                          "keys_file) and prints the key once; `report` shows what a running app's keys spent")
    keys.add_argument("what", choices=["new", "report"], help="new: add a key; report: each key's spend, holds, "
                      "prompt tokens and cached share, from the running app's keys ledger")
    keys.add_argument("--file", help="new: the keys file (created if absent; it holds hashes only)")
    keys.add_argument("--name", help="new: the key's name in metrics and reports")
    keys.add_argument("--app", default="proxray", help="report: the Serve application's name (default proxray)")
    keys.add_argument("--address", default="auto", help="report: the Ray cluster (default auto: RAY_ADDRESS or the "
                      "local one)")
    keys.add_argument("--lam", type=float, default=None, help="default λ of its routed requests")
    keys.add_argument("--models", type=comma_list(), default=None, help="comma-separated models it may reach "
                      "(default: all)")
    keys.add_argument("--rpm", type=float, default=None, help="requests a minute at most, across every replica")
    keys.add_argument("--budget-usd", type=float, default=None, help="USD it may spend per window")
    keys.add_argument("--budget-window-s", type=float, default=86400.0, help="the budget's window (default a day)")
    keys.add_argument("--over-budget", choices=["reject", "cheapest"], default="reject",
                      help="past the budget: 429, or route to the cheapest model it allows")
    keys.add_argument("--feedback", choices=["train", "record", "off"], default="record",
                      help="its POST /v1/feedback: train (the drift monitor learns from it), record (counted, never "
                      "trains the router; the default) or off (403)")
    keys.set_defaults(func=_cmd_keys)

    srv = sub.add_parser("serve", help="check a Serve config, then run it (serve run CONFIG), Ray's token auth as "
                         "configured")
    flag_with_old_positional(srv, "--config", help="Serve YAML, e.g. serve_configs/cpu_demo.yaml")
    srv.add_argument("--simulate", action="store_true", help="a rehearsal: every model on the simulated engine, "
                     "resources (accelerator types, GPUs), autoscaling and routing as configured")
    srv.set_defaults(func=_cmd_serve)

    chk = sub.add_parser("check", help="check Serve, job or monitor configs before anything starts: every problem "
                         "at once", description="Check configs (a Serve config, an evaluation job config, a "
                         "monitor config or a Ray cluster launcher config such as cluster.yaml; the kind is read from "
                         "its keys) before anything starts, every problem at once: the schema, the router (reachable, "
                         "versioned, its encoder the app's, knowing every served model), model sources, query files, "
                         "key files and their modes, prices, a cluster's head and whether its GCS is fault tolerant "
                         "(a warning, saying what a head loss costs, where no external Redis is configured), and with "
                         "--address the accelerator types and GPUs against the cluster. Exit 0 only when each would "
                         "deploy.")
    chk.add_argument("--config", required=True, nargs="+", help="one or more config YAML files")
    chk.add_argument("--address", default=None, help="a Ray cluster to check resources against (auto: the running "
                     "one)")
    chk.add_argument("--simulate", action="store_true", help="check the rehearsal (--simulate) of each config")
    chk.set_defaults(func=_cmd_check)

    gcs = sub.add_parser("gcs-clean", help="on a launcher cluster's head, with Ray stopped: remove its GCS tables from "
                         "the external Redis (RAY_REDIS_ADDRESS), so no later head restores them")
    gcs.add_argument("--env-file", default="~/.proxray/env", help="the file the head's start loads "
                     "(RAY_REDIS_ADDRESS, RAY_REDIS_PASSWORD, RAY_external_storage_namespace; default ~/.proxray/env)")
    gcs.set_defaults(func=_cmd_gcs_clean)

    demo = sub.add_parser("demo", help="end-to-end demos")
    demo.add_argument("name", choices=["serve", "drift"], help="serve: a routed answer from the CPU demo (fits its "
                      "router where missing, serves, asks, prints who answered and why); drift: the drift monitor's "
                      "whole loop on a CPU")
    demo.add_argument("rest", nargs=argparse.REMAINDER, help="the demo's own options (proxray demo serve --help, "
                      "proxray demo drift --help)")
    demo.set_defaults(func=_cmd_demo)
    mon = sub.add_parser("monitor", help="drift monitor: start (a detached actor that runs itself), status, "
                         "metrics (Prometheus text), versions (every router version it grew: served, candidate, rejected, "
                         "rolled back, with its lineage and gate figures), rollback (serve an "
                         "earlier version again; every ingress replica switches, between requests), stop")
    mon.add_argument("what", choices=["start", "status", "metrics", "versions", "rollback", "stop"],
                     help="what to do with the monitor")
    mon.add_argument("--to", type=int, default=None, help="rollback: the version to serve (default: the one the "
                     "served version replaced)")
    mon.add_argument("--config", default=None, help="monitor.yaml (start; elsewhere only for its name)")
    mon.add_argument("--name", default=None, help="actor name (default: the config's, else proxray-monitor)")
    mon.add_argument("--address", default="auto", help="Ray cluster address (default: the running one)")
    mon.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the monitor's answer "
                     "(start: its first, after it read its training table)")
    mon.add_argument("--simulate", action="store_true", help="start: a rehearsal, the evaluations it submits run "
                     "every model on the simulated engine")
    mon.set_defaults(func=_cmd_monitor)
