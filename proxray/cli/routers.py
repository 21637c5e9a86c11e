"""``proxray fit``, ``explain`` and ``eval``: routers fitted, asked and measured."""
from __future__ import annotations

import sys

from proxray.common.logs import log

ENCODER_HELP = ("static (distilled from the shipped MiniLM; static:PATH from another local model), or a "
                "sentence-transformers name or path; default: the shipped MiniLM")


def _cmd_fit(a):
    from proxray.cli.options import hyperparameters, spelled_by_cli, temperature_option
    from proxray.common.storage import check_location
    from proxray.data.table import RoutingTable
    from proxray.pool.simulated import make_table
    from proxray.routing.fitting import FitSettings, fit_table
    from proxray.routing.index import describe_index
    from proxray.routing.params import check_params
    from proxray.routing.registry import family

    temperature = temperature_option(a, a.router)  # before the table is read and encoded
    if a.encoder == "auto":
        from proxray.experiments.encoder_choice import check_choice_args

        check_choice_args(a.encoder_tolerance, a.encoder_sample, 1)
    check_location(a.out, "--out", write=True)  # the table is checked as it is read, also before encoding
    table = RoutingTable.read(a.table) if a.table else make_table()
    if a.table is None:
        print("no --table: fitting on the embedded SYNTHETIC routing table", file=sys.stderr)
    settings = FitSettings(router=a.router, models=a.models, hyperparameters=hyperparameters(a, a.router),
                           weighting=a.weighting, encoder=a.encoder,
                           temperature=temperature if a.inv_tau is not None else a.temperature)
    choice = None
    if a.encoder == "auto":
        from proxray.experiments.encoder_choice import choose_encoder, format_choice

        # the hyperparameters against the table before the comparison encodes it
        check_params(family(a.router), settings.hyperparameters, table.n_queries, spelled_by_cli(a.router))
        acc, cost = table.matrices(models=a.models or table.models)
        choice = choose_encoder(table.prompts, acc, cost, table.tasks, router=a.router,
                                tolerance_pp=a.encoder_tolerance, max_queries=a.encoder_sample, k=a.k,
                                n_clusters=a.clusters)
        print(format_choice(choice))
        settings.encoder = choice["chosen"]
    r = fit_table(table, settings, spelled=spelled_by_cli(a.router), encoder_choice=choice)
    r.save(a.out)
    print(f"fitted {r!r} on {table} -> {a.out}")
    line = describe_index(getattr(r, "index_info_", None))
    if line:
        print(line)


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


def _parse_budgets(v, cost) -> list:
    import numpy as np

    if not v:
        return []
    if cost is None:
        raise ValueError("--budgets needs a table with cost")
    try:
        out = [float(x) for x in v]
    except ValueError:
        raise ValueError(f"--budgets {','.join(v)!r}: expected comma-separated USD amounts per query, e.g. "
                         "0.0001,0.0005") from None
    if not all(np.isfinite(x) and x > 0 for x in out):
        raise ValueError(f"--budgets {','.join(v)!r}: every budget must be a number > 0")
    return out


def _load_table(table_path, n_per_task):
    from proxray.data.table import RoutingTable
    from proxray.pool.simulated import make_table

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
    from proxray.experiments.protocols import SPLITS, evaluate, protocol_split
    from proxray.routing.registry import family
    from proxray.experiments.report import format_result, write_json
    from proxray.cli.options import temperature_option
    from proxray.routing.temperature import Fixed

    table = _load_table(a.table, a.n_per_task)
    acc, cost = table.matrices()
    if a.outliers:
        outliers = a.outliers
    elif a.table is None:
        outliers = list(family(a.router).default_outliers)
    else:
        raise ValueError(f"--outliers is required with --table (tasks: {', '.join(sorted(set(table.tasks)))})")
    protocol = a.protocol or family(a.router).protocol
    protocol_split(table.tasks, outliers, protocol, 0)  # fail on bad outliers before the slow encoding
    budgets = _parse_budgets(a.budgets, cost)
    temperature = temperature_option(a, a.router)  # before the slow encoding
    if a.sweep:
        _check_sweep(a.sweep)
    X = _embed_prompts(table, a.encoder)
    seeds = a.seeds
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


def add_fit_explain(sub, full: bool = True) -> None:
    """``fit`` and ``explain``; ``full=False``: ``fit`` by its name and help alone, its options unbuilt
    (``build_parser``: they come from the router registry)."""
    fit = sub.add_parser("fit", help="fit a router on a table and save the artifact")
    if full:
        _fit_options(fit)

    exp = sub.add_parser("explain", help="why a router picks the model it picks for a text: the training queries or "
                         "clusters with the most weight, every model's estimate, the margin, the outlier score")
    exp.add_argument("text", help="the query text (a routed request's routing text)")
    exp.add_argument("--router", required=True, help="router artifact (a folder or a URI)")
    exp.add_argument("--lam", type=float, default=0.0, help="λ of acc − λ·cost (default 0: accuracy alone)")
    exp.add_argument("--top", type=int, default=10, help="reference elements shown, 1 to 20")
    exp.add_argument("--json", action="store_true", help="the evidence as JSON (what the endpoint returns)")
    exp.set_defaults(func=_cmd_explain)


def _fit_options(fit) -> None:
    from proxray.cli.options import DEFAULT_ROUTER, add_options, router_choices, add_temperature_options
    from proxray.common.cliargs import comma_list

    fit.add_argument("--table", default=None, help="routing table (default: the embedded synthetic one)")
    fit.add_argument("--models", type=comma_list(), default=None, help="comma-separated subset of the table's models")
    fit.add_argument("--router", choices=router_choices(), default=DEFAULT_ROUTER, help="KMeans clusters (default, as in "
                     "eval) or the k nearest training queries")
    add_options(fit, ("weighting", "k", "n_clusters", "max_regret", "route_budget_ms", "decision_tolerance",
                      "recall_floor"))
    add_temperature_options(fit)
    fit.add_argument("--encoder", default=None, help=ENCODER_HELP + "; auto: measure static against MiniLM on this "
                     "table's held-out tasks and keep static when it is within --encoder-tolerance")
    fit.add_argument("--encoder-tolerance", type=float, default=0.5, help="--encoder auto: percentage points of "
                     "mean overall AUC the static encoder may lose to MiniLM and still be kept")
    fit.add_argument("--encoder-sample", type=int, default=3000, help="--encoder auto: queries the comparison "
                     "uses at most (a seeded sample, every task kept; bounds its time)")
    fit.add_argument("--out", required=True, help="artifact folder")
    fit.set_defaults(func=_cmd_fit)


def add_eval(sub, full: bool = True) -> None:
    """``eval``; ``full=False``: by its name and help alone, its options unbuilt (``build_parser``)."""
    p = sub.add_parser("eval", help="run the paper's protocol on a routing table (default: the embedded synthetic one)")
    if full:
        _eval_options(p)


def _eval_options(p) -> None:
    from proxray.cli.options import DEFAULT_ROUTER, add_options, router_choices, add_temperature_options
    from proxray.routing.registry import FAMILIES
    from proxray.common.cliargs import comma_list
    from proxray.experiments.protocols import PROTOCOLS

    p.add_argument("--table", default=None, help="routing table; default: the embedded SYNTHETIC table")
    p.add_argument("--router", choices=router_choices(), default=DEFAULT_ROUTER, help="KMeans clusters or the k nearest "
                   "queries")
    p.add_argument("--protocol", choices=list(PROTOCOLS), default=None, help="default: " + ", ".join(
        f"{c.protocol} for {c.kind}" for c in FAMILIES) + " (the paper's settings)")
    p.add_argument("--outliers", type=comma_list(), default=None, help="comma-separated outlier tasks (required with "
                   "--table)")
    p.add_argument("--few-shot", type=int, default=25, help="few-shot-outlier: outlier queries in the training set")
    add_options(p, ("n_clusters", "k"))
    add_temperature_options(p)
    p.add_argument("--seeds", type=comma_list(int), default="42,7,99", help="comma-separated seeds (splits and KMeans)")
    p.add_argument("--encoder", default=None, help=ENCODER_HELP)
    p.add_argument("--n-per-task", type=int, default=200, help="synthetic table: queries per task")
    p.add_argument("--sweep", default=None, metavar="PARAM=V1,V2,…",
                   help="ablation: clusters=16,32,64 | k=50,100,200 | inv-tau=0,1,5,20,100,inf")
    p.add_argument("--budgets", type=comma_list(), default=None, metavar="USD1,USD2,…",
                   help="also report, at each mean cost per query, the accuracy and real cost each router reaches")
    p.add_argument("--json", default=None, help="write the result as JSON here")
    p.add_argument("--plot", default=None, help="write accuracy–cost curves (or the sweep) as PNG here")
    p.set_defaults(func=_cmd_eval)
