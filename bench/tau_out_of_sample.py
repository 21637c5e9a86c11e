"""Out-of-sample check of temperature constants (not a timed test): Prox − Base at fixed 1/tau and at the
spread temperature (spr:a) on 10 KMeans and 10 kNN configurations that bench/tau_selection.py never used
(other outlier sets and protocols of the same three tables), seeds 42, 7, 99. No CV: the question is whether a
constant picked on tau_selection's configurations carries over.

    python bench/tau_out_of_sample.py      (~5 min once the tables' embeddings are cached)
"""
import sys, numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from tau_selection import D, MIX, OUT_OF_SAMPLE as NEW, SEEDS
from proxray.embed import SentenceEncoder
from proxray.experiments import protocol_split
from proxray.metrics import routing_score
from proxray.table import RoutingTable
from proxray.tuning import GRID, estimates_over, make_router
SET = [*GRID, "spr:0.2", "spr:0.5", "spr:1", "spr:2", "spr:4", *MIX]


def main():
    enc = SentenceEncoder(progress=False); cache = {}; res = {"km": [], "knn": []}
    for name, router, protocol, outliers in NEW:
        if name not in cache:
            t = RoutingTable.read(D / f"{name}.parquet"); cache[name] = (t, enc.encode(t.prompts), *t.matrices())
        t, X, acc, cost = cache[name]; c = lambda idx: None if cost is None else cost[idx]
        per = []
        for seed in SEEDS:
            sp = protocol_split(t.tasks, outliers, protocol, seed); tr = sp.base_train
            f = make_router(router, "prox", {"n_clusters": 32, "k": 100, "random_state": seed}).fit(X[tr], acc[tr], c(tr))
            test = {"outlier": sp.test[sp.test_outlier], "inlier": sp.test[~sp.test_outlier], "overall": sp.test}
            per.append({k: [routing_score(a, ch, acc[idx], c(idx)) for a, ch in estimates_over(f, X[idx], SET)] for k, idx in test.items()})
        base = SET.index(float("inf")) if router == "km" else SET.index(0.0)
        res[router].append({k: [np.mean([p[k][g] - p[k][base] for p in per]) for g in range(len(SET))] for k in ("outlier", "inlier", "overall")})
        print(name, router, protocol, outliers, "done", file=sys.stderr, flush=True)
    for router, rows in res.items():
        print(f"\n{router}: {len(rows)} new configurations x 3 seeds, Prox - Base")
        print("best fixed 1/tau in hindsight: " + format(GRID[int(np.argmax([np.mean([r['overall'][g] for r in rows]) for g in range(len(GRID))]))], "g"))
        for g, s in enumerate(SET):
            d = {k: [r[k][g] for r in rows] for k in ("outlier", "inlier", "overall")}
            print(f"{str(s):8s} overall {np.mean(d['overall']):+.2f} outlier {np.mean(d['outlier']):+.2f} inlier {np.mean(d['inlier']):+.2f} "
                  f"losers {sum(v < -0.3 for v in d['outlier'])}/{sum(v < -0.5 for v in d['inlier'])} of {len(rows)}")


if __name__ == "__main__":
    main()
