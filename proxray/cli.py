"""``proxray`` command line: evaluate a pool, fit and measure routers, serve the routed endpoint, run its monitor."""
from __future__ import annotations

import argparse
import sys


def _cmd_import(a):
    from proxray.data import importers

    if a.format == "routerbench":
        table = importers.read_routerbench(a.paths, split=a.split, missing=a.missing, trust_pickle=a.trust_pickle)
    elif a.format == "routerdc":
        table = importers.read_routerdc(a.paths, missing=a.missing)
    else:
        table = importers.load_routerbench_hf(filename=a.paths[0] if a.paths else "routerbench_0shot.pkl",
                                              missing=a.missing, trust_pickle=a.trust_pickle)
    out = table.write(a.out)
    print(f"{table} -> {out}\n{table.report}")


def _cmd_info(a):
    import pandas as pd

    from proxray.data.table import RoutingTable

    table = RoutingTable.read(a.table, missing=a.missing)
    print(table)
    print(table.report)
    with pd.option_context("display.width", 200, "display.max_columns", 40, "display.precision", 4):
        print(table.summary())


def _cmd_fit(a):
    from proxray.data.synthetic import make_table
    from proxray.data.table import RoutingTable
    from proxray.embeddings.encoder import SentenceEncoder
    from proxray.experiments.protocols import temperature_option
    from proxray.routing.registry import make_router

    from proxray.common.storage import check_location

    temperature = temperature_option(a, a.router)  # before the table is read and encoded
    check_location(a.out, "--out", write=True)  # the table is checked as it is read, also before encoding
    table = RoutingTable.read(a.table) if a.table else make_table()
    if a.table is None:
        print("no --table: fitting on the embedded SYNTHETIC routing table", file=sys.stderr)
    models = a.models.split(",") if a.models else table.models
    acc, cost = table.matrices(models=models)
    enc = SentenceEncoder(a.encoder)
    X = enc.encode(table.prompts)
    r = make_router(a.router, a.weighting, {"n_clusters": a.clusters, "k": a.k}, temperature)
    r.fit(X, acc, cost, models=models, encoder_id=enc.id).save(a.out)
    print(f"fitted {r!r} on {table} -> {a.out}")


def _cmd_serve(a):
    import os
    import subprocess

    serve_bin = os.path.join(os.path.dirname(sys.executable), "serve")
    # Ray's token auth stays as configured (on by default in Ray 2.60: the local cluster makes a token)
    raise SystemExit(subprocess.call([serve_bin, "run", a.config]))


def _cmd_demo(a):
    from proxray.demos.drift import main as drift_main

    raise SystemExit(drift_main(a.rest))


def _cmd_monitor(a):
    """start: validate the config, start the detached monitor actor (its scheduler runs by itself) next to
    the running Serve app, print its status. status / metrics / stop: the running one, by name."""
    import json
    import time

    import ray

    from proxray.monitor import get_monitor, load_monitor_config, start_monitor, stop_monitor

    name = a.name
    cfg = None
    if a.config:
        cfg = load_monitor_config(a.config)  # before Ray: a bad config fails here, not inside an actor
        name = name or cfg.name
    name = name or "proxray-monitor"
    if a.what == "start" and cfg is None:
        raise ValueError("proxray monitor start needs --config monitor.yaml")
    ray.init(address=a.address, namespace="proxray", log_to_driver=False)
    if a.what == "start":
        actor = start_monitor(cfg, name=name)
        deadline = time.time() + a.timeout
        while True:  # the constructor encodes the training table: wait until it answers
            try:
                status = ray.get(actor.status.remote(), timeout=5)
                break
            except ray.exceptions.GetTimeoutError:
                if time.time() > deadline:
                    raise SystemExit(f"monitor {name!r} did not answer within {a.timeout:.0f} s")
        print(json.dumps(status, indent=2, default=str))
        return
    if a.what == "stop":
        print(json.dumps({"stopped": stop_monitor(name), "name": name}))
        return
    try:
        actor = get_monitor(name)
    except ValueError:
        raise SystemExit(f"no monitor named {name!r} is running (namespace proxray)") from None
    if a.what == "status":
        print(json.dumps(ray.get(actor.status.remote()), indent=2, default=str))
    else:
        print(ray.get(actor.prometheus.remote()), end="")


OVERVIEW = """\
proxray evaluates a pool of LLMs, learns where each one is good and cheap, and serves one OpenAI-compatible
endpoint that routes every query to the right model.

  evaluate a pool     proxray build-table --config JOB.yaml [--out DIR|s3://…]
                      (on a cluster: ray job submit … -- python jobs/build_table.py --config JOB.yaml)
  look at a table     proxray info --table TABLE
  import public data  proxray import routerbench|routerdc|hf FILES --out TABLE
  fit a router        proxray fit --table TABLE --out ROUTER [--router km|knn] [--encoder static]
  measure routers     proxray eval [--table TABLE --outliers TASKS] [--router km|knn]
  serve the endpoint  proxray serve --config SERVE.yaml
  watch for drift     proxray monitor start|status|metrics|stop [--config MONITOR.yaml]
  demos and tools     proxray demo drift · proxray make-tiny-model --out DIR"""
EPILOG = """\
What a command reads is --table or --config, what it writes is --out; a table, router or output can be a
local path or a URI (s3://, gs://, file://). `proxray COMMAND --help` lists a command's options."""


def build_parser() -> argparse.ArgumentParser:
    from proxray.common.cliargs import flag_with_old_positional
    from proxray.experiments.protocols import ENCODER_HELP, add_eval_parser, add_temperature_options  # numpy only

    p = argparse.ArgumentParser(prog="proxray", description=OVERVIEW, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    imp = sub.add_parser("import", help="import a public routing-data format into the canonical table")
    imp.add_argument("format", choices=["routerbench", "routerdc", "hf"], help="the public format to read")
    imp.add_argument("paths", nargs="*", help="input files (hf: the file in withmartian/routerbench)")
    imp.add_argument("--out", required=True, help="output table (.parquet, .csv or .jsonl)")
    imp.add_argument("--split", default=None, help="split for every row (default: from each file name)")
    imp.add_argument("--missing", choices=["drop", "error"], default="drop",
                     help="queries lacking some models: drop them (reported) or fail")
    imp.add_argument("--trust-pickle", action="store_true", help="allow reading a .pkl (unpickling can run code)")
    imp.set_defaults(func=_cmd_import)

    info = sub.add_parser("info", help="validate a routing table and print its model × task summary")
    flag_with_old_positional(info, "--table", help="routing table: .parquet, .csv or .jsonl, a path or a URI")
    info.add_argument("--missing", choices=["drop", "error"], default="drop",
                      help="queries lacking some models: drop them (reported) or fail")
    info.set_defaults(func=_cmd_info)

    fit = sub.add_parser("fit", help="fit a router on a table and save the artifact")
    fit.add_argument("--table", default=None, help="routing table (default: the embedded synthetic one)")
    fit.add_argument("--models", default=None, help="comma-separated subset of the table's models")
    fit.add_argument("--router", choices=["km", "knn"], default="km", help="KMeans clusters (default, as in eval) "
                     "or the k nearest training queries")
    fit.add_argument("--weighting", choices=["base", "prox"], default="prox",
                     help="prox: proximity-weighted (robust on unfamiliar queries); base: the classic router")
    fit.add_argument("--k", type=int, default=100, help="knn: neighbours per query")
    fit.add_argument("--clusters", type=int, default=32, help="km: KMeans clusters")
    add_temperature_options(fit)
    fit.add_argument("--encoder", default=None, help=ENCODER_HELP)
    fit.add_argument("--out", required=True, help="artifact folder")
    fit.set_defaults(func=_cmd_fit)

    srv = sub.add_parser("serve", help="run a Serve config (serve run CONFIG), Ray's token auth as configured")
    flag_with_old_positional(srv, "--config", help="Serve YAML, e.g. serve_configs/cpu_demo.yaml")
    srv.set_defaults(func=_cmd_serve)

    demo = sub.add_parser("demo", help="end-to-end demos")
    demo.add_argument("name", choices=["drift"], help="drift: the drift monitor's whole loop on a CPU")
    demo.add_argument("rest", nargs=argparse.REMAINDER, help="the demo's own options (proxray demo drift --help)")
    demo.set_defaults(func=_cmd_demo)
    mon = sub.add_parser("monitor", help="drift monitor: start (a detached actor that runs itself), status, "
                         "metrics (Prometheus text), stop")
    mon.add_argument("what", choices=["start", "status", "metrics", "stop"], help="what to do with the monitor")
    mon.add_argument("--config", default=None, help="monitor.yaml (start; elsewhere only for its name)")
    mon.add_argument("--name", default=None, help="actor name (default: the config's, else proxray-monitor)")
    mon.add_argument("--address", default="auto", help="Ray cluster address (default: the running one)")
    mon.add_argument("--timeout", type=float, default=300.0, help="start: seconds to wait for the monitor")
    mon.set_defaults(func=_cmd_monitor)

    # light modules: their heavy imports happen inside the commands
    from proxray.evaljob.job import add_parsers as add_job_parsers

    add_eval_parser(sub)
    add_job_parsers(sub)
    return p


def main(argv=None) -> int:
    from proxray.common.cliargs import settle

    args = build_parser().parse_args(argv)
    settle(args)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, KeyError) as e:  # ConfigError and TableValidationError too
        print(f"proxray {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
