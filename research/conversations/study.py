"""Multi-turn conversations routed turn by turn against conversations that keep their model, and which text routes a
turn, on conversations built from the shared routing tables.

    python -m research.conversations.study [--out research/conversations/results.json] [--conversations 400]

A conversation is 4 queries of one table asked in a row: of one task (a topic-coherent conversation), or, for half of
them, changing task after the second turn. The router (kNN, k = 100, the static encoder; KMeans, K = 32) is fitted on
the table's other queries. Each turn is routed at λ = 0 and at the table's median λ (the λ at which the router's
choices cost half of what the most accurate model costs) by four policies: each turn alone on its own text (what
proxray did before), each turn alone on the whole conversation so far, each turn alone on the last two turns, and the
conversation keeping its model within the served margins (escalate 0.02, step down 0.05) on the turn's own text. Per
policy: how often the model changes between turns, and the mean accuracy and cost of the answers (a turn's
correctness is the table's for its query asked alone: the study measures routing, not conversational quality).
Seeds 42, 7, 99; mean and the spread between seeds.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
TABLES = ["routerbench_slice", "bbh19_dev"]  # the tables with cost
SEEDS = (42, 7, 99)
TURNS = 4


def conversations(table, rng, n: int) -> list:
    """n conversations of TURNS query rows each (indices into the table's queries), half of them changing task."""
    tasks = np.asarray(table.tasks)
    by_task = {t: np.flatnonzero(tasks == t) for t in np.unique(tasks)}
    names = sorted(by_task)
    out = []
    for c in range(n):
        t1 = names[rng.integers(len(names))]
        t2 = names[rng.integers(len(names))] if c % 2 else t1
        rows = list(rng.choice(by_task[t1], 2, replace=False)) + list(rng.choice(by_task[t2], 2, replace=False))
        out.append(rows)
    return out


def run(table_name: str, n: int, seed: int, enc) -> dict:
    from proxray import KMeansRouter, KNNRouter, RoutingTable
    from proxray.serve.config import ConversationSpec
    from proxray.serve.tenancy.conversations import keep

    table = RoutingTable.read(DATA / f"{table_name}.parquet")
    acc, cost = table.matrices()
    models = list(table.models)
    rng = np.random.default_rng(seed)
    convs = conversations(table, rng, n)
    in_conv = np.zeros(table.n_queries, bool)
    in_conv[[r for c in convs for r in c]] = True
    prompts = list(table.prompts)
    X = enc.encode(prompts)
    train = np.flatnonzero(~in_conv)
    spec = ConversationSpec()
    results = {}
    for rname, router in (("knn", KNNRouter(k=100)), ("km", KMeansRouter(random_state=seed))):
        router.fit(X[train], acc[train], cost[train], models=models)
        # λ where the router's choices cost about half of the most accurate model's (the table's middle)
        a_hat, c_hat = router.estimate(X[in_conv])
        best_cost = float(np.mean(c_hat[:, int(np.argmax(acc[train].mean(0)))]))
        lams = np.logspace(-1, 7, 60) / max(best_cost, 1e-12)
        costs = [float(np.mean(c_hat[np.arange(len(c_hat)), np.argmax(a_hat - lam * c_hat, 1)])) for lam in lams]
        mid = float(lams[int(np.argmin(np.abs(np.array(costs) - best_cost / 2)))])
        for lam_name, lam in (("lam0", 0.0), ("lam_mid", mid)):
            texts = {"own turn": lambda c, t: prompts[c[t]],
                     "whole conversation": lambda c, t: "\n".join(prompts[r] for r in c[:t + 1]),
                     "last two turns": lambda c, t: "\n".join(prompts[r] for r in c[max(0, t - 1):t + 1])}
            for policy in ("own turn", "whole conversation", "last two turns", "kept (own turn)"):
                text = texts["own turn" if policy.startswith("kept") else policy]
                all_texts = [text(c, t) for c in convs for t in range(TURNS)]
                Xt = enc.encode(all_texts)
                A, C = router.estimate(Xt)
                chosen, switches = [], 0
                for ci, c in enumerate(convs):
                    prev = None
                    for t in range(TURNS):
                        i = ci * TURNS + t
                        obj = A[i] - lam * C[i]
                        order = [models[j] for j in np.argsort(-obj, kind="stable")]
                        if policy.startswith("kept"):
                            keep(order, prev, A[i], C[i], lam, models, spec)
                        m = models.index(order[0])
                        switches += prev is not None and models[m] != prev
                        prev = models[m]
                        chosen.append((c[t], m))
                rows, cols = np.array(chosen).T
                results[f"{rname}/{lam_name}/{policy}"] = {
                    "switch_rate": switches / (len(convs) * (TURNS - 1)),
                    "accuracy": float(acc[rows, cols].mean()), "cost": float(cost[rows, cols].mean())}
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="research/conversations/results.json")
    p.add_argument("--conversations", type=int, default=400)
    a = p.parse_args(argv)
    from proxray import SentenceEncoder

    enc = SentenceEncoder("static", progress=False)
    summary = {}
    for table in TABLES:
        per_seed = [run(table, a.conversations, s, enc) for s in SEEDS]
        for key in per_seed[0]:
            vals = {m: [r[key][m] for r in per_seed] for m in per_seed[0][key]}
            summary[f"{table}/{key}"] = {m: {"mean": float(np.mean(v)), "sd": float(np.std(v))} for m, v in vals.items()}
            s = summary[f"{table}/{key}"]
            print(f"{table:18s} {key:40s} switches {s['switch_rate']['mean']:.3f}  acc {s['accuracy']['mean']:.4f} "
                  f"± {s['accuracy']['sd']:.4f}  cost {s['cost']['mean']:.3g}", flush=True)
    Path(a.out).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
