"""A protocol result as people read it: the paper's table layout (``format_result``) and JSON (``write_json``)."""
from __future__ import annotations

import json

import numpy as np

from proxray.experiments.protocols import BASELINE_KEYS, ROUTER_KEYS, SPLITS
from proxray.routing.registry import LABELS


def format_result(res: dict) -> str:
    """The paper's table layout: splits × (Base, Prox, AllSee, Random, Largest, Oracle), mean ± std."""
    name = LABELS[res["router"]]
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


def write_json(path, obj) -> None:
    """``obj`` as JSON at ``path``; infinities written as "inf" / "-inf" (JSON has none)."""
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
