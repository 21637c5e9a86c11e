"""``proxray`` command line: evaluate a pool, fit and measure routers, serve the routed endpoint, run its monitor.

Every command is registered here (``build_parser``); what a command does lives in the package, imported when it
runs, so ``proxray --help`` imports nothing heavy."""
from __future__ import annotations

import argparse
import sys

from proxray.common.logs import log


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

    if a.router is not None:
        if a.table is not None:
            raise ValueError("proxray info: give --table or --router, not both")
        return _router_info(a.router)
    if a.table is None:
        raise ValueError("proxray info needs --table TABLE (a routing table) or --router ROUTER (an artifact)")
    table = RoutingTable.read(a.table, missing=a.missing)
    print(table)
    print(table.report)
    with pd.option_context("display.width", 200, "display.max_columns", 40, "display.precision", 4):
        print(table.summary())


def _router_info(path):
    """A router artifact's manifest as a person reads it: class, models, training queries, encoder (and how it was
    chosen), index, temperature, version."""
    from proxray.experiments.encoder_choice import format_choice
    from proxray.routing.artifact import read_manifest

    m = read_manifest(path)
    print(f"{m.router_class} at {path}: {m.n_train} training queries, {len(m.models)} models, dim {m.dim}, "
          f"{'with' if m.has_cost else 'without'} cost, saved by proxray {m.proxray_version}")
    print(f"models: {', '.join(m.models)}")
    print(f"params: {', '.join(f'{k}={v}' for k, v in sorted(m.params.items()))}; temperature {m.temperature}")
    print(f"encoder: {m.encoder_id}")
    if m.encoder_choice:
        print(format_choice(m.encoder_choice))
    if m.index:
        print(f"index: {m.index.get('kind')}, recall@{m.index.get('k')} {m.index.get('recall_at_k')} — "
              f"{m.index.get('chosen')}")


def _cmd_fit(a):
    from proxray.pool.simulated import make_table
    from proxray.data.table import RoutingTable
    from proxray.embeddings.encoder import SentenceEncoder
    from proxray.routing.registry import check_fit_memory, make_router
    from proxray.routing.temperature import temperature_option

    from proxray.common.storage import check_location

    temperature = temperature_option(a, a.router)  # before the table is read and encoded
    if a.encoder == "auto":
        from proxray.experiments.encoder_choice import check_choice_args

        check_choice_args(a.encoder_tolerance, a.encoder_sample, 1)
    check_location(a.out, "--out", write=True)  # the table is checked as it is read, also before encoding
    table = RoutingTable.read(a.table) if a.table else make_table()
    if a.table is None:
        print("no --table: fitting on the embedded SYNTHETIC routing table", file=sys.stderr)
    models = a.models.split(",") if a.models else table.models
    acc, cost = table.matrices(models=models)
    if a.router == "knn":
        from proxray.routing.routers import check_k

        check_k(a.k, len(acc), "--k ")  # before the table is encoded
    check_fit_memory(len(acc), len(models), a.router)  # before the table is encoded
    choice, setting = None, a.encoder
    if a.encoder == "auto":
        from proxray.experiments.encoder_choice import choose_encoder, format_choice

        choice = choose_encoder(table.prompts, acc, cost, table.tasks, router=a.router,
                                tolerance_pp=a.encoder_tolerance, max_queries=a.encoder_sample, k=a.k,
                                n_clusters=a.clusters)
        print(format_choice(choice))
        setting = choice["chosen"]
    enc = SentenceEncoder(setting)
    X = enc.encode(table.prompts)
    r = make_router(a.router, a.weighting, {"n_clusters": a.clusters, "k": a.k, "recall_floor": a.recall_floor},
                    temperature)
    r.fit(X, acc, cost, models=models, encoder_id=enc.id, query_ids=table.query_ids, tasks=table.tasks)
    if choice is not None:
        r.encoder_choice_ = choice
    r.save(a.out)
    print(f"fitted {r!r} on {table} -> {a.out}")
    info = getattr(r, "index_info_", None)
    if info:
        knobs = ", ".join(f"{k}={info[k]}" for k in ("nlist", "nprobe", "hnsw_m", "ef_search") if k in info)
        print(f"index: {info['kind']}{f' ({knobs})' if knobs else ''}, recall@{info['k']} {info['recall_at_k']} "
              f"against exact search — {info['chosen']}")


def _cmd_explain(a):
    import json

    from proxray.embeddings.encoder import SentenceEncoder
    from proxray.routing.explain import evidence, format_evidence
    from proxray.routing.registry import load_router

    router = load_router(a.router)
    if not hasattr(router, "neighbourhood"):
        raise ValueError(f"{a.router}: holds a {type(router).__name__}; only KNNRouter and KMeansRouter give evidence")
    X = SentenceEncoder(router.encoder_id_, progress=False).encode([a.text])
    ev = evidence(router, X[0], a.lam, top=a.top)
    print(json.dumps(ev, indent=1) if a.json else format_evidence(ev))


def _cmd_keys(a):
    from proxray.serve.keys import new_key_entry

    budget = None
    if a.budget_usd is not None:
        budget = {"usd": a.budget_usd, "window_s": a.budget_window_s, "over_budget": a.over_budget}
    key = new_key_entry(a.file, a.name, lam=a.lam, allowed_models=a.models.split(",") if a.models else None,
                        requests_per_minute=a.rpm, budget=budget)
    print(f"added key {a.name!r} to {a.file} (its hash; ingress replicas pick it up within seconds). The key, shown "
          "this once:", file=sys.stderr)
    print(key)


def _cmd_check(a):
    from proxray.check import check

    reports = [check(path, a.address, a.simulate) for path in a.config]
    print("\n".join(r.text() for r in reports))
    return 0 if all(r.ok for r in reports) else 2


def _cmd_serve(a):
    """``proxray check``'s checks first (a problem stops it before anything starts), then ``serve run``; with
    ``--simulate`` the config's rehearsal, written beside the run's other files."""
    import os
    import subprocess
    import tempfile

    import yaml

    from proxray.check import check, simulated_serve_config

    config = a.config
    if a.simulate:
        raw = yaml.safe_load(open(config))
        config = os.path.join(tempfile.mkdtemp(prefix="proxray-rehearsal-"), os.path.basename(config))
        with open(config, "w") as f:
            yaml.safe_dump(simulated_serve_config(raw), f, sort_keys=False)
    report = check(config)
    print(report.text(), file=sys.stderr)
    if not report.ok:
        raise SystemExit(2)
    serve_bin = os.path.join(os.path.dirname(sys.executable), "serve")
    # Ray's token auth stays as configured (on by default in Ray 2.60: the local cluster makes a token)
    raise SystemExit(subprocess.call([serve_bin, "run", config]))


def _cmd_demo(a):
    from proxray.demos.drift import main as drift_main

    raise SystemExit(drift_main(a.rest))


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
    import time

    import ray

    from proxray.monitor import get_monitor, load_monitor_config, start_monitor, stop_monitor

    name = a.name
    cfg = None
    if a.config:
        cfg = load_monitor_config(a.config)  # before Ray: a bad config fails here, not inside an actor
        if a.simulate:
            from proxray.monitor.config import rehearsal

            cfg = rehearsal(cfg)
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
        print(json.dumps(status, indent=2, default=str), file=out)
        return
    if a.what == "stop":
        print(json.dumps({"stopped": stop_monitor(name), "name": name}), file=out)
        return
    try:
        actor = get_monitor(name)
    except ValueError:
        raise SystemExit(f"no monitor named {name!r} is running (namespace proxray)") from None
    if a.what == "status":
        print(json.dumps(ray.get(actor.status.remote()), indent=2, default=str), file=out)
    else:
        print(ray.get(actor.prometheus.remote()), end="", file=out)


# ---- proxray eval: the paper's protocol on a table --------------------------------------------------
def _parse_budgets(v, cost) -> list:
    import numpy as np

    if not v:
        return []
    if cost is None:
        raise ValueError("--budgets needs a table with cost")
    try:
        out = [float(x) for x in v.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--budgets {v!r}: expected comma-separated USD amounts per query, e.g. 0.0001,0.0005") from None
    if not out or not all(np.isfinite(x) and x > 0 for x in out):
        raise ValueError(f"--budgets {v!r}: every budget must be a number > 0")
    return out


def _load_table(table_path, n_per_task):
    from proxray.pool.simulated import make_table
    from proxray.data.table import RoutingTable

    if table_path is None:
        log(f"no --table: using the embedded SYNTHETIC routing table (real text, simulated correctness; "
            f"10 tasks × {n_per_task} queries, 14 models with the paper's Table 2 skills and prices)")
        return make_table(n_per_task)
    table = RoutingTable.read(table_path)
    log(f"{table_path}: {table}; {table.report}")
    return table


def _embed_prompts(table, encoder_name):
    import time

    from proxray.embeddings.encoder import SentenceEncoder

    enc = SentenceEncoder(encoder_name)
    log(f"encoding {table.n_queries} prompts with {enc.id} (cached on disk after the first run)")
    t0 = time.time()
    X = enc.encode(table.prompts)
    log(f"encoded in {time.time() - t0:.1f}s")
    return X


def _cmd_eval(a) -> None:
    from proxray.experiments.plots import plot_curves, plot_sweep
    from proxray.experiments.protocols import DEFAULT_SYNTH_OUTLIERS, SPLITS, evaluate, protocol_split
    from proxray.experiments.report import format_result, write_json
    from proxray.routing.temperature import Fixed, temperature_option

    table = _load_table(a.table, a.n_per_task)
    acc, cost = table.matrices()
    if a.outliers:
        outliers = [o.strip() for o in a.outliers.split(",") if o.strip()]
    elif a.table is None:
        outliers = DEFAULT_SYNTH_OUTLIERS[a.router]
    else:
        raise ValueError(f"--outliers is required with --table (tasks: {', '.join(sorted(set(table.tasks)))})")
    protocol = a.protocol or ("leave-task-out" if a.router == "km" else "few-shot-outlier")
    protocol_split(table.tasks, outliers, protocol, 0)  # fail on bad outliers before the slow encoding
    budgets = _parse_budgets(a.budgets, cost)
    temperature = temperature_option(a, a.router)  # before the slow encoding
    if a.sweep:
        _check_sweep(a.sweep)
    X = _embed_prompts(table, a.encoder)
    seeds = [int(s) for s in a.seeds.split(",")]
    common = dict(router=a.router, protocol=protocol, outliers=outliers, seeds=seeds, few_shot=a.few_shot,
                  n_clusters=a.clusters, k=a.k, temperature=temperature)
    if a.sweep:
        param, _, values = a.sweep.partition("=")
        rows = []
        for v in values.split(","):
            kw = dict(common)
            if param == "clusters":
                kw["n_clusters"] = int(v)
            elif param == "k":
                kw["k"] = int(v)
            else:
                kw["temperature"] = Fixed(v)
            res = evaluate(X, acc, cost, table.tasks, **kw)
            value = float(v) if param == "inv-tau" else int(v)
            rows.append({"value": value, "result": res})
            print(f"\n{param} = {v}\n{format_result(res)}", flush=True)
        print(f"\nsweep of {param} (Prox / Base / AllSee, {rows[0]['result']['metric']})")
        for sp in SPLITS:
            print(f"  {sp:8s} " + "  ".join(
                f"{r['value']}: {r['result']['splits'][sp]['prox']:.2f}/{r['result']['splits'][sp]['base']:.2f}/"
                f"{r['result']['splits'][sp]['allsee']:.2f}" for r in rows))
        if a.json:
            out = [{"value": r["value"], **{k: v for k, v in r["result"].items() if not k.startswith("_")}} for r in rows]
            write_json(a.json, {"sweep": param, "rows": out})
        if a.plot:
            plot_sweep(rows, param, a.plot)
            log(f"wrote {a.plot}")
        return
    res = evaluate(X, acc, cost, table.tasks, keep_curves=bool(a.plot), budgets=budgets, **common)
    print(format_result(res), flush=True)
    if a.json:
        write_json(a.json, {k: v for k, v in res.items() if not k.startswith("_")})
        log(f"wrote {a.json}")
    if a.plot:
        plot_curves(res, a.plot)
        log(f"wrote {a.plot}")


def _check_sweep(sweep: str) -> None:
    from proxray.routing.temperature import Fixed

    param, _, values = sweep.partition("=")
    if param not in ("clusters", "k", "inv-tau") or not values:
        raise ValueError(f"--sweep {sweep!r}: expected clusters=…, k=… or inv-tau=… with comma-separated values")
    for v in values.split(","):
        Fixed(v) if param == "inv-tau" else int(v)


# ---- proxray build-table / make-tiny-model: the evaluation job and its dev tool ------------------------
def _cmd_make_tiny_model(a) -> None:
    from proxray.devtools import build_tiny_model

    print(build_tiny_model(a.out, a.seed, hidden=a.hidden, layers=a.layers, heads=a.heads))


def _cmd_build_table(a) -> None:
    from proxray.common.storage import Store
    from proxray.evaljob import load_config, run_job

    from proxray.evaljob.config import rehearsal, sampled

    config = load_config(a.config)
    if a.simulate:
        config = rehearsal(config)
    if a.sample is not None:
        config = sampled(config, a.sample)
    res = run_job(config, a.out, models=a.models.split(",") if a.models else None, max_batches=a.max_batches)
    out = Store(res["output"])
    if out.exists("summary.md"):
        print(out.read_text("summary.md"))
    print({k: v for k, v in res.items() if k != "runs"})


OVERVIEW = """\
proxray evaluates a pool of LLMs, learns where each one is good and cheap, and serves one OpenAI-compatible
endpoint that routes every query to the right model.

  evaluate a pool     proxray build-table --config JOB.yaml [--out DIR|s3://…] [--sample N] [--simulate]
                      (on a cluster: ray job submit … -- python jobs/build_table.py --config JOB.yaml)
  look at a table     proxray info --table TABLE
  import public data  proxray import routerbench|routerdc|hf FILES --out TABLE
  fit a router        proxray fit --table TABLE --out ROUTER [--router km|knn] [--encoder static]
  measure routers     proxray eval [--table TABLE --outliers TASKS] [--router km|knn]
  explain a decision  proxray explain "TEXT" --router ROUTER [--lam λ] [--json]
  check a config      proxray check --config SERVE|JOB|MONITOR.yaml [--address auto] [--simulate]
  serve the endpoint  proxray serve --config SERVE.yaml [--simulate]
  API keys, policies  proxray keys new --file KEYS.yaml --name N [--lam λ] [--models …] [--rpm R] [--budget-usd U]
  watch for drift     proxray monitor start|status|metrics|stop [--config MONITOR.yaml]
  demos and tools     proxray demo drift · proxray make-tiny-model --out DIR"""
EPILOG = """\
What a command reads is --table or --config, what it writes is --out; a table, router or output can be a
local path or a URI (s3://, gs://, file://). `proxray COMMAND --help` lists a command's options."""


ENCODER_HELP = ("static (distilled from the shipped MiniLM; static:PATH from another local model), or a "
                "sentence-transformers name or path; default: the shipped MiniLM")


def _add_eval(sub) -> None:
    from proxray.experiments.protocols import PROTOCOLS
    from proxray.routing.temperature import add_temperature_options

    p = sub.add_parser("eval", help="run the paper's protocol on a routing table (default: the embedded synthetic one)")
    p.add_argument("--table", default=None, help="routing table; default: the embedded SYNTHETIC table")
    p.add_argument("--router", choices=["km", "knn"], default="km", help="KMeans clusters or the k nearest queries")
    p.add_argument("--protocol", choices=list(PROTOCOLS), default=None,
                   help="default: leave-task-out for km, few-shot-outlier for knn (the paper's settings)")
    p.add_argument("--outliers", default=None, help="comma-separated outlier tasks (required with --table)")
    p.add_argument("--few-shot", type=int, default=25, help="few-shot-outlier: outlier queries in the training set")
    p.add_argument("--clusters", type=int, default=32, help="km: KMeans clusters")
    p.add_argument("--k", type=int, default=100, help="knn: neighbours per query")
    add_temperature_options(p)
    p.add_argument("--seeds", default="42,7,99", help="comma-separated seeds (splits and KMeans)")
    p.add_argument("--encoder", default=None, help=ENCODER_HELP)
    p.add_argument("--n-per-task", type=int, default=200, help="synthetic table: queries per task")
    p.add_argument("--sweep", default=None, metavar="PARAM=V1,V2,…",
                   help="ablation: clusters=16,32,64 | k=50,100,200 | inv-tau=0,1,5,20,100,inf")
    p.add_argument("--budgets", default=None, metavar="USD1,USD2,…",
                   help="also report, at each mean cost per query, the accuracy and real cost each router reaches")
    p.add_argument("--json", default=None, help="write the result as JSON here")
    p.add_argument("--plot", default=None, help="write accuracy–cost curves (or the sweep) as PNG here")
    p.set_defaults(func=_cmd_eval)


def _add_job(sub) -> None:
    from proxray.common.cliargs import flag_with_old_positional, renamed_flag

    p = sub.add_parser("build-table", help="run the evaluation job: every model on every query -> routing table",
                       description="Run the evaluation job on this machine or the running Ray cluster: every model "
                       "of the config's pool on every query, graded and priced, written as a routing table.")
    p.add_argument("--config", required=True, help="job YAML, e.g. jobs/configs/cpu_tiny.yaml")
    p.add_argument("--out", default=None, help="output folder or filesystem URI, e.g. s3://bucket/run "
                   "(default: the config's output)")
    renamed_flag(p, "--output", "--out")
    p.add_argument("--models", default=None, help="comma-separated model ids to run (default: all)")
    p.add_argument("--sample", type=int, default=None, metavar="N", help="at most N queries of each query set (seeded)"
                   ": try a job on a few queries first; a full run later resumes from its rows")
    p.add_argument("--simulate", action="store_true", help="a rehearsal on a CPU: every model on the simulated engine "
                   "(ids, prices and resources kept), Hub query sets as their synthetic stand-ins")
    p.add_argument("--max-batches", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_build_table)
    t = sub.add_parser("make-tiny-model", help="build a tiny random causal LM + BPE tokenizer offline (for CPU runs)",
                       description="Write a tiny random causal LM with its BPE tokenizer, made offline, that vLLM "
                       "on a CPU loads like any Hugging Face folder (for tests and demos).")
    flag_with_old_positional(t, "--out", help="folder to write the model into")
    t.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    t.add_argument("--hidden", type=int, default=64, help="hidden size (head size = hidden / heads)")
    t.add_argument("--layers", type=int, default=2, help="transformer layers")
    t.add_argument("--heads", type=int, default=2, help="attention heads (vLLM on a CPU needs head size 32, 64, 80, …)")
    t.set_defaults(func=_cmd_make_tiny_model)


def build_parser() -> argparse.ArgumentParser:
    from proxray.common.cliargs import flag_with_old_positional
    from proxray.routing.temperature import add_temperature_options  # numpy only

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

    info = sub.add_parser("info", help="validate a routing table and print its model × task summary, or describe a "
                          "router artifact")
    flag_with_old_positional(info, "--table", required=False, help="routing table: .parquet, .csv or .jsonl, a path "
                             "or a URI")
    info.add_argument("--router", default=None, help="a router artifact (folder or URI): its models, encoder (and "
                      "the comparison --encoder auto made), index and parameters")
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
    fit.add_argument("--recall-floor", type=float, default=0.95, help="knn: recall@k against exact search an "
                     "approximate index must reach (tables over 8k queries; below it, exact search)")
    add_temperature_options(fit)
    fit.add_argument("--encoder", default=None, help=ENCODER_HELP + "; auto: measure static against MiniLM on this "
                     "table's held-out tasks and keep static when it is within --encoder-tolerance")
    fit.add_argument("--encoder-tolerance", type=float, default=0.5, help="--encoder auto: percentage points of "
                     "mean overall AUC the static encoder may lose to MiniLM and still be kept")
    fit.add_argument("--encoder-sample", type=int, default=3000, help="--encoder auto: queries the comparison "
                     "uses at most (a seeded sample, every task kept; bounds its time)")
    fit.add_argument("--out", required=True, help="artifact folder")
    fit.set_defaults(func=_cmd_fit)

    exp = sub.add_parser("explain", help="why a router picks the model it picks for a text: the training queries or "
                         "clusters with the most weight, every model's estimate, the margin, the outlier score")
    exp.add_argument("text", help="the query text (a routed request's routing text)")
    exp.add_argument("--router", required=True, help="router artifact (a folder or a URI)")
    exp.add_argument("--lam", type=float, default=0.0, help="λ of acc − λ·cost (default 0: accuracy alone)")
    exp.add_argument("--top", type=int, default=10, help="reference elements shown, 1 to 20")
    exp.add_argument("--json", action="store_true", help="the evidence as JSON (what the endpoint returns)")
    exp.set_defaults(func=_cmd_explain)

    keys = sub.add_parser("keys", help="API keys with their own policy: `new` adds one to a keys file (the app's "
                          "keys_file) and prints the key once")
    keys.add_argument("what", choices=["new"], help="new: add a key")
    keys.add_argument("--file", required=True, help="the keys file (created if absent; it holds hashes only)")
    keys.add_argument("--name", required=True, help="the key's name in metrics and reports")
    keys.add_argument("--lam", type=float, default=None, help="default λ of its routed requests")
    keys.add_argument("--models", default=None, help="comma-separated models it may reach (default: all)")
    keys.add_argument("--rpm", type=float, default=None, help="requests a minute at most, across every replica")
    keys.add_argument("--budget-usd", type=float, default=None, help="USD it may spend per window")
    keys.add_argument("--budget-window-s", type=float, default=86400.0, help="the budget's window (default a day)")
    keys.add_argument("--over-budget", choices=["reject", "cheapest"], default="reject",
                      help="past the budget: 429, or route to the cheapest model it allows")
    keys.set_defaults(func=_cmd_keys)

    srv = sub.add_parser("serve", help="check a Serve config, then run it (serve run CONFIG), Ray's token auth as "
                         "configured")
    flag_with_old_positional(srv, "--config", help="Serve YAML, e.g. serve_configs/cpu_demo.yaml")
    srv.add_argument("--simulate", action="store_true", help="a rehearsal: every model on the simulated engine, "
                     "resources (accelerator types, GPUs), autoscaling and routing as configured")
    srv.set_defaults(func=_cmd_serve)

    chk = sub.add_parser("check", help="check Serve, job or monitor configs before anything starts: every problem "
                         "at once", description="Check configs (a Serve config, an evaluation job config or a "
                         "monitor config; the kind is read from its keys) before anything starts, every problem at "
                         "once: the schema, the router (reachable, versioned, its encoder the app's, knowing every "
                         "served model), model sources, query files, key files and their modes, prices, and with "
                         "--address the accelerator types and GPUs against the cluster. Exit 0 only when each would "
                         "deploy.")
    chk.add_argument("--config", required=True, nargs="+", help="one or more config YAML files")
    chk.add_argument("--address", default=None, help="a Ray cluster to check resources against (auto: the running "
                     "one)")
    chk.add_argument("--simulate", action="store_true", help="check the rehearsal (--simulate) of each config")
    chk.set_defaults(func=_cmd_check)

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
    mon.add_argument("--simulate", action="store_true", help="start: a rehearsal, the evaluations it submits run "
                     "every model on the simulated engine")
    mon.set_defaults(func=_cmd_monitor)

    _add_eval(sub)
    _add_job(sub)
    return p


def main(argv=None) -> int:
    from proxray.common.cliargs import settle

    args = build_parser().parse_args(argv)
    settle(args)
    try:
        return args.func(args) or 0  # a command may return its exit status (proxray check: 2 when it would not deploy)
    except (ValueError, FileNotFoundError, KeyError) as e:  # ConfigError and TableValidationError too
        print(f"proxray {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
