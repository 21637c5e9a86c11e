"""The paper's experimental protocols (§4, appendix H) as one function and one command each.

* ``leave-task-out``: inlier queries split 60/40 (per task, seeded); Base and Prox fit on the inlier
  60 %; AllSee fits on that plus 60 % of each outlier task; everything is tested on the inlier 40 %
  plus the outlier 40 % AllSee never saw.
* ``few-shot-outlier``: the same, plus ``few_shot`` outlier queries (from the outliers' 60 % part)
  in Base's and Prox's training set.

Reported per split (outlier, inlier, overall): normalized AUC (%) of Base, Prox, AllSee and of the
Random, Largest and Oracle baselines — or, for a table without cost, mean accuracy (%) at λ = 0 —
as mean and standard deviation over seeds.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from proxray.common.logs import log
from proxray.experiments.metrics import baseline_points, cost_range, ndch_auc, routing_score, sweep
from proxray.routing.registry import make_router
from proxray.routing.temperature import Fixed, Temperature, from_options, parse_temperature

PROTOCOLS = ("leave-task-out", "few-shot-outlier")
SPLITS = ("outlier", "inlier", "overall")
ROUTER_KEYS = ("base", "prox", "allsee")
BASELINE_KEYS = ("random", "largest", "oracle")
LABELS = {"base": "Base", "prox": "Prox", "allsee": "AllSee"}
DEFAULT_SYNTH_OUTLIERS = {"km": ["hellaswag", "medqa"], "knn": ["gsm8k", "svamp"]}


@dataclass
class Split:
    base_train: np.ndarray   # indices Base and Prox learn from
    allsee_train: np.ndarray  # indices AllSee learns from
    test: np.ndarray         # indices everything is tested on
    test_outlier: np.ndarray  # bool mask over ``test``


def protocol_split(tasks, outliers, protocol: str, seed: int, few_shot: int = 25, train_frac: float = 0.6) -> Split:
    """Index sets of one protocol run (see the module docstring)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r}: allowed values are {', '.join(PROTOCOLS)}")
    tasks = np.asarray(tasks)
    unknown = sorted(set(outliers) - set(tasks))
    if unknown:
        raise ValueError(f"outlier task(s) {unknown} are not in the table (tasks: {sorted(set(tasks))})")
    if set(outliers) == set(tasks):
        raise ValueError("every task is an outlier: at least one inlier task is needed")
    rng = np.random.default_rng(seed)
    in_tr, in_te, out_seen, out_te = [], [], [], []
    for t in sorted(set(tasks)):
        idx = rng.permutation(np.flatnonzero(tasks == t))
        cut = int(round(train_frac * len(idx)))
        if t in outliers:
            out_seen.append(idx[:cut])
            out_te.append(idx[cut:])
        else:
            in_tr.append(idx[:cut])
            in_te.append(idx[cut:])
    in_tr, in_te = np.concatenate(in_tr), np.concatenate(in_te)
    out_seen, out_te = np.concatenate(out_seen), np.concatenate(out_te)
    base_train = in_tr
    if protocol == "few-shot-outlier":
        shots = rng.choice(out_seen, size=min(few_shot, len(out_seen)), replace=False)
        base_train = np.concatenate([in_tr, shots])
    test = np.concatenate([in_te, out_te])
    return Split(np.sort(base_train), np.sort(np.concatenate([in_tr, out_seen])), test,
                 np.concatenate([np.zeros(len(in_te), bool), np.ones(len(out_te), bool)]))


def baseline_scores(acc, cost, largest: int) -> dict:
    if cost is None:
        return {"random": 100 * float(acc.mean()), "largest": 100 * float(acc[:, largest].mean()),
                "oracle": 100 * float(acc.max(1).mean())}
    b = baseline_points(acc, cost, largest)
    c = cost_range(acc, cost)
    return {k: ndch_auc(b[k], *c) for k in BASELINE_KEYS}


def budget_scores(fitted: dict, X_cal, Xt, at, ct, budgets, test_outlier) -> list:
    """At each budget (USD per query): per router the λ calibrated on its training queries
    (``router.calibrate``), and the accuracy (%) and mean cost it really reaches on the test queries — on all
    of them, and apart on the inlier and the outlier ones (``test_outlier`` (q,) bool: where a budget calibrated
    on the training tasks breaks); and the best single model that costs no more on the test queries than the
    router spent."""
    rows, out = np.arange(len(Xt)), []
    parts = {"inlier": ~test_outlier, "outlier": test_outlier}
    single_acc, single_cost = at.mean(0), ct.mean(0)
    for b in budgets:
        entry = {"budget": float(b)}
        for name, r in fitted.items():
            try:
                lam = r.calibrate(X_cal[name], target_cost=b)
            except ValueError:  # below what the cheapest routing spends on the training queries
                entry[name] = None
                continue
            pick = r.route(Xt, lam=lam)
            paid = ct[rows, pick]
            spent = float(paid.mean())
            affordable = single_acc[single_cost <= spent]
            entry[name] = {"lam": float(lam), "accuracy": 100 * float(at[rows, pick].mean()), "cost": spent,
                           **{f"cost_{part}": float(paid[m].mean()) if m.any() else None for part, m in parts.items()},
                           "best_single": 100 * float(affordable.max()) if len(affordable) else None}
        out.append(entry)
    return out


def run_once(X, acc, cost, tasks, router: str, protocol: str, outliers, seed: int, few_shot: int = 25,
             n_clusters: int = 32, k: int = 100, temperature="auto", keep_curves: bool = False, budgets=()) -> dict:
    """One seed of one protocol: {"scores": {split: {key: value}}, "temperature": Prox's, as its spec, "curves": …,
    "budgets": [per budget: per router λ, accuracy and cost reached on the test split]}.
    ``temperature``: anything ``parse_temperature`` takes ("auto": the router's shipped one), or a callable
    ``(X, acc, cost, tasks, router, hp, protocol=, few_shot=, seed=) -> Temperature`` that chooses it from the
    training split alone (how research/tau plugs in the rules it studies)."""
    sp = protocol_split(tasks, outliers, protocol, seed, few_shot)
    hp = {"n_clusters": n_clusters, "k": k, "random_state": seed}
    if callable(temperature) and not isinstance(temperature, Temperature):
        tr = sp.base_train
        chosen = temperature(X[tr], acc[tr], None if cost is None else cost[tr], tasks[tr], router, hp,
                             protocol=protocol, few_shot=few_shot, seed=seed)
    else:
        chosen = parse_temperature(temperature, router)
    c_tr = (lambda idx: None if cost is None else cost[idx])
    fitted = {
        "base": make_router(router, "base", hp).fit(X[sp.base_train], acc[sp.base_train], c_tr(sp.base_train)),
        "prox": make_router(router, "prox", hp, chosen).fit(X[sp.base_train], acc[sp.base_train], c_tr(sp.base_train)),
        "allsee": make_router(router, "base", hp).fit(X[sp.allsee_train], acc[sp.allsee_train], c_tr(sp.allsee_train)),
    }
    Xt, at, ct = X[sp.test], acc[sp.test], c_tr(sp.test)
    estimates = {name: r.estimate(Xt) for name, r in fitted.items()}
    tr_cost = acc[sp.base_train] if cost is None else cost[sp.base_train]
    largest = int(np.argmax(tr_cost.mean(0)))  # most expensive on training data (most accurate without cost)
    masks = {"outlier": sp.test_outlier, "inlier": ~sp.test_outlier, "overall": np.ones(len(sp.test), bool)}
    scores, curves = {}, {}
    for split, m in masks.items():
        a, c = at[m], None if ct is None else ct[m]
        s = {name: routing_score(e[0][m], e[1][m], a, c) for name, e in estimates.items()}
        s.update(baseline_scores(a, c, largest))
        scores[split] = s
        if keep_curves and c is not None:
            curves[split] = {name: sweep(e[0][m], e[1][m], a, c)[2] for name, e in estimates.items()}
            curves[split].update({key: v for key, v in baseline_points(a, c, largest).items() if key != "singles"})
    budget = []
    if budgets and cost is not None:
        cal = {"base": X[sp.base_train], "prox": X[sp.base_train], "allsee": X[sp.allsee_train]}
        budget = budget_scores(fitted, cal, Xt, at, ct, budgets, sp.test_outlier)
    return {"scores": scores, "temperature": chosen.spec, "curves": curves, "budgets": budget}


def _mean_budgets(runs) -> list:
    """Budget results averaged over seeds (a router that could not meet a budget in some seed: None)."""
    out = []
    for i, first in enumerate(runs[0]["budgets"]):
        entry = {"budget": first["budget"]}
        for name in ROUTER_KEYS:
            got = [r["budgets"][i][name] for r in runs]
            if any(g is None for g in got):
                entry[name] = None
                continue
            entry[name] = {key: (None if any(g[key] is None for g in got) else float(np.mean([g[key] for g in got])))
                           for key in got[0]}
        out.append(entry)
    return out


def evaluate(X, acc, cost, tasks, router="km", protocol="leave-task-out", outliers=(), seeds=(42, 7, 99),
             few_shot=25, n_clusters=32, k=100, temperature="auto", keep_curves=False, budgets=()) -> dict:
    """All seeds; the result has the JSON shape of ``proxray eval --json`` ("temperature": Prox's spec per seed)."""
    runs = []
    for s in seeds:
        log(f"seed {s}: {router} / {protocol} / outliers {', '.join(outliers)}")
        runs.append(run_once(X, acc, cost, np.asarray(tasks), router, protocol, list(outliers), s, few_shot,
                             n_clusters, k, temperature, keep_curves=keep_curves and not runs, budgets=budgets))
    keys = ROUTER_KEYS + BASELINE_KEYS
    mean = {sp: {key: float(np.mean([r["scores"][sp][key] for r in runs])) for key in keys} for sp in SPLITS}
    std = {sp: {key: float(np.std([r["scores"][sp][key] for r in runs])) for key in keys} for sp in SPLITS}
    return {"router": router, "protocol": protocol, "outliers": list(outliers),
            "temperature": [r["temperature"] for r in runs], "metric": "auc" if cost is not None else "accuracy",
            "seeds": list(seeds), "splits": mean, "std": std, "budgets": _mean_budgets(runs),
            "_curves": runs[0]["curves"]}


def format_result(res: dict) -> str:
    """The paper's table layout: splits × (Base, Prox, AllSee, Random, Largest, Oracle), mean ± std."""
    name = {"km": "KM", "knn": "kNN"}[res["router"]]
    metric = "normalized AUC %" if res["metric"] == "auc" else "accuracy % at λ=0 (table has no cost)"
    temps = res["temperature"] if isinstance(res["temperature"], list) else [res["temperature"]]
    kinds = {t.partition(":")[0] for t in temps}
    lines = [f"{name} router, {res['protocol']}, outliers: {', '.join(res['outliers'])}, "
             f"seeds {res['seeds']}, Prox temperature: {', '.join(dict.fromkeys(temps))}"
             + ("  (spread:c = 1/tau(x) = c / std of the query's distances)" if "spread" in kinds else "")
             + ("  (plug-in:c = per query the 1/tau minimizing the bias–variance bound, c its bias weight)"
                if "plug-in" in kinds else "")
             + f"  ({metric})"]
    head = ["Split", f"{name}-Base", f"{name}-Prox", f"{name}-AllSee", "Random", "Largest", "Oracle"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for sp in SPLITS:
        cells = [f"{res['splits'][sp][k]:.2f} ± {res['std'][sp][k]:.2f}" for k in ROUTER_KEYS + BASELINE_KEYS]
        lines.append(f"| {sp} | " + " | ".join(cells) + " |")
    d = res["splits"]["outlier"]["prox"] - res["splits"]["outlier"]["base"]
    di = res["splits"]["inlier"]["prox"] - res["splits"]["inlier"]["base"]
    lines.append(f"Prox − Base: outlier {d:+.2f} pp, inlier {di:+.2f} pp")
    if res.get("budgets"):
        lines.append("\nAt a budget (λ calibrated on the training queries; test split): accuracy % / USD really "
                     "spent per query, all queries (inlier; outlier queries)")
        lines.append(f"| budget $/query | {name}-Base | {name}-Prox | {name}-AllSee | best single model within that spend |")
        lines.append("|---|---|---|---|---|")
        part = (lambda v: "—" if v is None else f"{v:.3g}")
        for b in res["budgets"]:
            cells = ["cannot meet it" if b[k] is None else f"{b[k]['accuracy']:.2f} / {b[k]['cost']:.3g} "
                     f"({part(b[k]['cost_inlier'])}; {part(b[k]['cost_outlier'])})" for k in ROUTER_KEYS]
            single = b["prox"] and b["prox"]["best_single"]
            single = "—" if single is None else f"{single:.2f}"
            lines.append(f"| {b['budget']:.3g} | " + " | ".join(cells) + f" | {single} |")
    return "\n".join(lines)


def plot_curves(res: dict, path) -> None:
    """Accuracy–cost curves per split (first seed) for every router and baseline, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = res["_curves"]
    if not curves:
        log("no cost in this table: no accuracy–cost plot")
        return
    budgets = [b for b in res.get("budgets") or [] if b["prox"] is not None]
    fig, axes = plt.subplots(1, 3 + 2 * bool(budgets), figsize=(15 + 10 * bool(budgets), 4.2))
    style = {"base": ("tab:blue", "-o"), "prox": ("tab:green", "-s"), "allsee": ("tab:gray", "--^"),
             "oracle": ("black", ":")}
    name = {"km": "KM", "knn": "kNN"}[res["router"]]
    if budgets:
        _plot_budget_accuracy(axes[3], budgets, name, style)
        _plot_budget_spend(axes[4], budgets, f"{name}-Prox")
    for ax, sp in zip(axes, SPLITS):
        for key, pts in curves[sp].items():
            pts = np.asarray(pts)
            if key in ("random", "largest"):
                pts = pts[-1:]  # the largest model's own point (its row 0 is the cheapest model)
                ax.scatter(pts[:, 0], pts[:, 1] * 100, marker="*" if key == "largest" else "x", s=80, label=key, zorder=5)
                continue
            order = np.argsort(pts[:, 0])
            color, fmt = style[key]
            label = f"{name}-{LABELS[key]}" if key in ROUTER_KEYS else "Oracle"
            ax.plot(pts[order, 0], pts[order, 1] * 100, fmt, color=color, ms=3, label=f"{label} ({res['splits'][sp][key]:.1f})")
        ax.set_title(f"{sp} queries")
        ax.set_xlabel("mean cost per query (USD)")
        ax.set_ylabel("mean accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{name} router, {res['protocol']}, outliers: {', '.join(res['outliers'])} (AUC % in legend)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_budget_accuracy(ax, budgets: list, name: str, style: dict) -> None:
    """``--budgets``' first panel: the accuracy each router reaches on the test split at each budget (λ calibrated on
    its training queries; mean over seeds; a budget a router cannot meet is left out), beside the best single model
    that costs no more than Prox really spent."""
    x = np.array([b["budget"] for b in budgets])
    for key in ROUTER_KEYS:
        color, fmt = style[key]
        ax.plot(x, _budget_series(budgets, key, "accuracy"), fmt, color=color, ms=4, label=f"{name}-{LABELS[key]}")
    ax.plot(x, _budget_series(budgets, "prox", "best_single"), "*:", color="tab:orange", ms=8,
            label=f"best single model costing ≤ {name}-Prox's spend")
    _finish_budget_panel(ax, "accuracy at a budget (test split)", "mean accuracy (%)")


def _plot_budget_spend(ax, budgets: list, label: str) -> None:
    """``--budgets``' second panel: what Prox really spends per query on the test split (all, inlier, outlier
    queries; mean over seeds) against the budget its λ was calibrated for on the training queries; on the diagonal
    the budget holds."""
    x = np.array([b["budget"] for b in budgets])
    for key, fmt in (("cost", "-s"), ("cost_inlier", "--o"), ("cost_outlier", ":^")):
        part = key.partition("_")[2] or "all"
        ax.plot(x, _budget_series(budgets, "prox", key), fmt, label=f"{label}, {part} queries")
    ax.plot(x, x, color="black", lw=0.8, label="spend = budget")
    ax.set_yscale("log")
    _finish_budget_panel(ax, "spend at a budget (λ calibrated on training queries)",
                         "really spent on the test split (USD per query)")


def _budget_series(budgets: list, router: str, key: str) -> np.ndarray:
    """One value of ``budget_scores``' entries per budget; NaN where the router could not meet it or it is None."""
    return np.array([np.nan if b[router] is None or b[router][key] is None else b[router][key] for b in budgets])


def _finish_budget_panel(ax, title: str, ylabel: str) -> None:
    ax.set_xscale("log")
    ax.set_title(title)
    ax.set_xlabel("budget (USD per query)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)


def plot_sweep(rows: list, param: str, path) -> None:
    """AUC (or accuracy) versus a swept hyperparameter, one line per split and router."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    xs = [r["value"] for r in rows]
    xplot = [x if np.isfinite(x) else max(v for v in xs if np.isfinite(v)) * 4 for x in xs]
    for ax, sp in zip(axes, SPLITS):
        for key, color in (("base", "tab:blue"), ("prox", "tab:green"), ("allsee", "tab:gray")):
            ax.plot(xplot, [r["result"]["splits"][sp][key] for r in rows], "-o", color=color, label=key)
        ax.set_xscale("symlog" if param == "inv-tau" else "linear")
        ax.set_title(sp)
        ax.set_xlabel("1/tau" if param == "inv-tau" else param)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- command line --------------------------------------------------------------------------------
ENCODER_HELP = ("static (distilled from the shipped MiniLM; static:PATH from another local model), or a "
                "sentence-transformers name or path; default: the shipped MiniLM")


def add_eval_parser(sub) -> None:
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
    p.set_defaults(func=cmd_eval)


TEMPERATURE_HELP = ("Prox's temperature: auto (default: kNN spread:0.2, 1/tau(x) = 0.2 / std of the query's k "
                    "distances; KMeans plug-in:0.125, per query the 1/tau minimizing the bias–variance bound over the "
                    "clusters; neither runs a CV), a number or fixed:N (a fixed 1/tau; inf = nearest only), spread:C, "
                    "plug-in:C (docs: the temperature)")


def add_temperature_options(p, default="auto") -> None:
    """``--temperature`` (and the deprecated ``--inv-tau``; ``--cv-rule`` / ``--cv-repeats`` now refused with where the
    CV rules went) on a subcommand's parser."""
    import argparse

    p.add_argument("--temperature", default=default, metavar="SPEC", help=TEMPERATURE_HELP)
    p.add_argument("--inv-tau", default=None, help=argparse.SUPPRESS)  # deprecated: --temperature
    p.add_argument("--cv-rule", default=None, help=argparse.SUPPRESS)  # the CV rules are research/tau's
    p.add_argument("--cv-repeats", default=None, help=argparse.SUPPRESS)


def temperature_option(a, router: str):
    """The ``Temperature`` a parsed command line asked for (``temperature.from_options``), a deprecation said once on
    stderr; ``--cv-rule`` / ``--cv-repeats`` are refused with where the cross-validated rules live now."""
    for flag, v in (("--cv-rule", a.cv_rule), ("--cv-repeats", a.cv_repeats)):
        if v is not None:
            raise ValueError(f"{flag} {v}: the cross-validated temperature rules are not part of proxray (its auto "
                             "temperatures need no CV); the τ study keeps them: python research/tau/tau_selection.py")
    got, deprecation = from_options(a.temperature, a.inv_tau, router)
    if deprecation:
        log(deprecation)
    return got


def parse_inv_tau(v):
    """A fixed 1/tau as ``--sweep inv-tau=...`` lists it: a number >= 0 or inf."""
    try:
        f = float(v)
    except ValueError:
        raise ValueError(f"inv-tau {v!r}: expected a number >= 0 or inf") from None
    if not f >= 0:
        raise ValueError(f"inv-tau {v!r}: expected a number >= 0 or inf")
    return f


def _parse_budgets(v, cost) -> list:
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


def load_table(table_path, n_per_task):
    from proxray.data.synthetic import make_table
    from proxray.data.table import RoutingTable

    if table_path is None:
        log(f"no --table: using the embedded SYNTHETIC routing table (real text, simulated correctness; "
            f"10 tasks × {n_per_task} queries, 14 models with the paper's Table 2 skills and prices)")
        return make_table(n_per_task)
    table = RoutingTable.read(table_path)
    log(f"{table_path}: {table}; {table.report}")
    return table


def embed_prompts(table, encoder_name):
    from proxray.embeddings.encoder import SentenceEncoder

    enc = SentenceEncoder(encoder_name)
    log(f"encoding {table.n_queries} prompts with {enc.id} (cached on disk after the first run)")
    t0 = time.time()
    X = enc.encode(table.prompts)
    log(f"encoded in {time.time() - t0:.1f}s")
    return X


def cmd_eval(a) -> None:
    table = load_table(a.table, a.n_per_task)
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
    X = embed_prompts(table, a.encoder)
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
                kw["temperature"] = Fixed(parse_inv_tau(v))
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
            _write_json(a.json, {"sweep": param, "rows": out})
        if a.plot:
            plot_sweep(rows, param, a.plot)
            log(f"wrote {a.plot}")
        return
    res = evaluate(X, acc, cost, table.tasks, keep_curves=bool(a.plot), budgets=budgets, **common)
    print(format_result(res), flush=True)
    if a.json:
        _write_json(a.json, {k: v for k, v in res.items() if not k.startswith("_")})
        log(f"wrote {a.json}")
    if a.plot:
        plot_curves(res, a.plot)
        log(f"wrote {a.plot}")


def _check_sweep(sweep: str) -> None:
    param, _, values = sweep.partition("=")
    if param not in ("clusters", "k", "inv-tau") or not values:
        raise ValueError(f"--sweep {sweep!r}: expected clusters=…, k=… or inv-tau=… with comma-separated values")
    for v in values.split(","):
        parse_inv_tau(v) if param == "inv-tau" else int(v)


def _write_json(path, obj):
    def clean(v):
        if isinstance(v, float) and not np.isfinite(v):
            return "inf" if v > 0 else "-inf"
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    with open(path, "w") as f:
        json.dump(clean(obj), f, indent=2)

