"""A protocol result as pictures: accuracy–cost curves per split, accuracy and spend at a budget, and a swept
hyperparameter (matplotlib, imported when drawing)."""
from __future__ import annotations

import numpy as np

from proxray.common.logs import log
from proxray.experiments.protocols import LABELS, ROUTER_KEYS, SPLITS
from proxray.routing.registry import LABELS as ROUTER_LABELS


def plot_curves(res: dict, path) -> None:
    """Accuracy–cost curves per split (first seed) for every router and baseline, and each single model's point, as
    a PNG."""
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
    name = ROUTER_LABELS[res["router"]]
    if budgets:
        _plot_budget_accuracy(axes[3], budgets, name, style)
        _plot_budget_spend(axes[4], budgets, f"{name}-Prox")
    for ax, sp in zip(axes, SPLITS):
        for key, pts in curves[sp].items():
            pts = np.asarray(pts)
            if key == "singles":  # each model of the pool alone
                ax.scatter(pts[:, 0], pts[:, 1] * 100, s=14, color="tab:orange", alpha=0.7, label="single models",
                           zorder=4)
                continue
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
