"""Can fine-tuning the static table on the routing table's own tasks close its math gap?

    python -m research.static_encoder.finetune [--table routerdc7] [--outliers gsm8k,math_prealgebra]
                                               [--epochs 3] [--out research/static_encoder/finetune.json]

The static encoder loses on RouterDC with math held out (few-shot-outlier: kNN Prox outlier accuracy 63.7 % with
MiniLM, 45.4 % static; ``research/static-encoder.md``). Here the distilled table is trained further, per seed, on
the queries the few-shot router itself learns from (the inlier 60 % plus the 25 few-shot queries of each held-out
task — nothing from the test split): the mean of a text's token rows, unit-normed as at inference, goes through a
linear head that predicts the query's task (cross-entropy weighted by inverse task frequency, so 25 math queries
count as much as 6,000 MMLU ones), and the token rows move with the head (Adam). The routers then run on the tuned
table's embeddings with the same protocol and seeds, and are compared with MiniLM's and the distilled table's.
This is model2vec's ``StaticModelForClassification`` recipe written against ``StaticSession`` (no new dependency).
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import time
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
SEEDS = (42, 7, 99)


def token_ids(session, texts) -> list:
    return [e.ids[:session.max_tokens] for e in session.tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def finetune(session, ids, labels, epochs: int, seed: int, lr: float = 1e-3, batch: int = 64,
             acc=None) -> np.ndarray:
    """The session's table trained to tell ``labels`` apart from the mean of each text's rows — or, given ``acc``
    (n, M), to predict which models answer each text correctly (the routing target itself; binary cross-entropy)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    keep = [i for i, t in enumerate(ids) if t]
    classes = sorted(set(labels))
    y = torch.tensor([classes.index(labels[i]) for i in keep])
    counts = torch.bincount(y, minlength=len(classes)).float()
    weight = (counts.sum() / (len(classes) * counts)).clamp(max=100.0)
    table = torch.nn.EmbeddingBag.from_pretrained(torch.tensor(session.vectors), freeze=False, mode="mean")
    head = torch.nn.Linear(session.dim, len(classes) if acc is None else acc.shape[1])
    target = None if acc is None else torch.tensor(np.asarray(acc)[keep], dtype=torch.float32)
    opt = torch.optim.Adam([*table.parameters(), *head.parameters()], lr=lr)
    for _ in range(epochs):
        order = rng.permutation(len(keep))
        for s in range(0, len(order), batch):
            rows = order[s:s + batch]
            seqs = [ids[keep[r]] for r in rows]
            flat = torch.tensor(list(itertools.chain.from_iterable(seqs)))
            offsets = torch.tensor(np.concatenate(([0], np.cumsum([len(q) for q in seqs])[:-1])))
            emb = F.normalize(table(flat, offsets), dim=1)
            if target is None:
                loss = F.cross_entropy(head(emb) * 20.0, y[rows], weight=weight)  # 20: a cosine classifier's scale
            else:  # each row weighted as its task is, so the few-shot queries count
                per = F.binary_cross_entropy_with_logits(head(emb) * 20.0, target[rows], reduction="none").mean(1)
                loss = (per * weight[y[rows]]).sum() / weight[y[rows]].sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return table.weight.detach().numpy().astype(np.float32)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", default="routerdc7")
    p.add_argument("--outliers", default="gsm8k,math_prealgebra")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--routers", default="knn,km")
    p.add_argument("--target", choices=["task", "accuracy"], default="task",
                   help="what the tuned table learns to predict: the query's task, or each model's correctness")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    from proxray.data.table import RoutingTable
    from proxray.embeddings.encoder import SentenceEncoder
    from proxray.experiments.protocols import evaluate, protocol_split

    t = RoutingTable.read(DATA / f"{a.table}.parquet")
    acc, cost = t.matrices()
    tasks = np.asarray(t.tasks)
    outliers = a.outliers.split(",")
    enc = SentenceEncoder("static", progress=False)
    session = enc.static_session
    ids = token_ids(session, t.prompts)
    X = {"MiniLM": SentenceEncoder(progress=False).encode(t.prompts), "static": enc.encode(t.prompts)}
    results = []
    for seed in SEEDS:
        sp = protocol_split(tasks, outliers, "few-shot-outlier", seed, 25)
        t0 = time.time()
        tuned = copy.copy(session)
        tuned.vectors = finetune(session, [ids[i] for i in sp.base_train], list(tasks[sp.base_train]), a.epochs, seed,
                                 acc=acc[sp.base_train] if a.target == "accuracy" else None)
        X["static, tuned"] = tuned.encode(list(t.prompts))
        train_s = time.time() - t0
        for name, Xe in X.items():
            for router in a.routers.split(","):
                res = evaluate(Xe, acc, cost, tasks, router=router, protocol="few-shot-outlier", outliers=outliers,
                               seeds=(seed,))
                row = {"encoder": name, "router": router, "seed": seed,
                       **{f"prox_{sp_}": res["splits"][sp_]["prox"] for sp_ in ("outlier", "inlier", "overall")}}
                results.append(row)
                print(json.dumps({**row, "train_s": round(train_s, 1)}), flush=True)
    summary = {}
    for name in X:
        for router in a.routers.split(","):
            rs = [r for r in results if r["encoder"] == name and r["router"] == router]
            summary[f"{name} / {router}"] = {k: (round(float(np.mean([r[k] for r in rs])), 2),
                                                 round(float(np.std([r[k] for r in rs])), 2))
                                             for k in ("prox_outlier", "prox_inlier", "prox_overall")}
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps({"table": a.table, "outliers": outliers, "epochs": a.epochs, "target": a.target,
                                           "summary": summary, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
