"""The "KM + kNN blend" candidate (not a timed test): the mean of KM-Prox's and kNN-Prox's estimates,
against each router alone and against the better Base, on every configuration of research/tau/tau_selection.py and
research/tau/tau_out_of_sample.py (protocol and outliers; the router named there is ignored), seeds 42, 7, 99.

    python research/tau/tau_blend.py      (~6 min once the tables' embeddings are cached)

Settings are fixed (no CV): KM 1/tau = 20 (the paper's) and inf (Base), kNN 1/tau = 2 (the study's best) and 0
(Base). Printed per set: the mean over configurations of each estimator's normalized AUC minus the better of the
two Bases (per configuration, chosen in hindsight: a strong reference), and how many configurations lose
> 0.3 pp outlier / > 0.5 pp inlier against it.
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tau_selection import CONFIGS, D, OUT_OF_SAMPLE, SEEDS, test_splits  # noqa: E402

from proxray.embeddings.encoder import SentenceEncoder  # noqa: E402
from proxray.experiments.protocols import protocol_split  # noqa: E402
from proxray.experiments.metrics import routing_score  # noqa: E402
from proxray.data.table import RoutingTable  # noqa: E402
from cv import estimates_over, make_router  # noqa: E402

NAMES = ("KM Base", "kNN Base", "KM-Prox 20", "kNN-Prox 2", "blend Base", "blend Prox (KM 20 + kNN 2)",
         "blend KM 20 + kNN Base")


def scores(t, X, acc, cost, protocol, outliers, seed):
    c = (lambda idx: None if cost is None else cost[idx])
    sp = protocol_split(t.tasks, outliers, protocol, seed)
    tr = sp.base_train
    hp = {"n_clusters": 32, "k": 100, "random_state": seed}
    km = make_router("km", "prox", hp).fit(X[tr], acc[tr], c(tr))
    knn = make_router("knn", "prox", hp).fit(X[tr], acc[tr], c(tr))
    out = {}
    for split, idx in test_splits(sp).items():
        (kb, kbc), (k20, k20c) = estimates_over(km, X[idx], [float("inf"), 20.0])
        (nb, nbc), (n2, n2c) = estimates_over(knn, X[idx], [0.0, 2.0])
        cc = lambda a, b: None if a is None else (a + b) / 2  # noqa: E731
        est = [(kb, kbc), (nb, nbc), (k20, k20c), (n2, n2c), ((kb + nb) / 2, cc(kbc, nbc)),
               ((k20 + n2) / 2, cc(k20c, n2c)), ((k20 + nb) / 2, cc(k20c, nbc))]
        out[split] = [routing_score(a, ch, acc[idx], c(idx)) for a, ch in est]
    return out


def main():
    enc, cache = SentenceEncoder(progress=False), {}
    for label, configs in (("tau_selection's configurations", CONFIGS), ("tau_out_of_sample's", OUT_OF_SAMPLE)):
        seen, rows = set(), []
        for name, _, protocol, outliers in configs:
            key = (name, protocol, tuple(outliers))
            if key in seen:
                continue
            seen.add(key)
            if name not in cache:
                t = RoutingTable.read(D / f"{name}.parquet")
                cache[name] = (t, enc.encode(t.prompts), *t.matrices())
            per = [scores(*cache[name], protocol, outliers, s) for s in SEEDS]
            rows.append({k: np.mean([p[k] for p in per], axis=0) for k in per[0]})
            print(f"[blend] {name} {protocol} {','.join(outliers)}", file=sys.stderr, flush=True)
        print(f"\n{label}: {len(rows)} (protocol, outliers) configurations x {len(SEEDS)} seeds, "
              "minus the better Base of the configuration (pp)")
        print("| estimator | Δ outlier | Δ inlier | Δ overall | losing > 0.3 pp outlier | > 0.5 pp inlier |")
        print("|---|---|---|---|---|---|")
        best_base = [int(np.argmax(r["overall"][:2])) for r in rows]
        for i, n in enumerate(NAMES):
            d = {k: [r[k][i] - r[k][b] for r, b in zip(rows, best_base)] for k in ("outlier", "inlier", "overall")}
            print(f"| {n} | {np.mean(d['outlier']):+.2f} | {np.mean(d['inlier']):+.2f} | {np.mean(d['overall']):+.2f} | "
                  f"{sum(v < -0.3 for v in d['outlier'])}/{len(rows)} | {sum(v < -0.5 for v in d['inlier'])}/{len(rows)} |")


if __name__ == "__main__":
    main()
