"""``proxray import``, ``info``, ``build-table`` and ``make-tiny-model``: tables in, tables out."""
from __future__ import annotations

import argparse


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
        from proxray.routing.index import describe_index

        print(describe_index({"recall_at_k": None, "k": None, "chosen": None, **m.index}))


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
    res = run_job(config, a.out, models=a.models, max_batches=a.max_batches)
    out = Store(res["output"])
    if out.exists("summary.md"):
        print(out.read_text("summary.md"))
    print({k: v for k, v in res.items() if k != "runs"})


def add_import_info(sub) -> None:
    from proxray.common.cliargs import flag_with_old_positional

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


def add_job(sub) -> None:
    from proxray.common.cliargs import comma_list, flag_with_old_positional, renamed_flag

    p = sub.add_parser("build-table", help="run the evaluation job: every model on every query -> routing table",
                       description="Run the evaluation job on this machine or the running Ray cluster: every model "
                       "of the config's pool on every query, graded and priced, written as a routing table.")
    p.add_argument("--config", required=True, help="job YAML, e.g. jobs/configs/cpu_tiny.yaml")
    p.add_argument("--out", default=None, help="output folder or filesystem URI, e.g. s3://bucket/run "
                   "(default: the config's output)")
    renamed_flag(p, "--output", "--out")
    p.add_argument("--models", type=comma_list(), default=None, help="comma-separated model ids to run (default: all)")
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
