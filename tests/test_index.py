"""The kNN router's index: exact search up to EXACT_MAX references; above, the fastest index within the route budget
whose *decisions* lose at most max_regret against exact search's (the utility its changed decisions lose, on
references held out of the index while it is built, then added, at the λ its costs span) — exact search among the
candidates where it fits the budget — and, where nothing meets the bound, the least regret under the budget with a
warning; an optional recall floor; recorded in the artifact and read back without a rebuild; live growth keeps it
valid; KMeans on a sample above its row limit. Sizes here are small: the limits are lowered for the test, and exact
search is timed as at a large set where a test is about the approximate index (bench/bench_scale.py measures the
real sizes)."""
import warnings
import json

import numpy as np
import pytest

from conftest import blobs
from proxray import KMeansRouter, KNNRouter
from proxray.routing import index as index_mod
from proxray.routing import kmeans as routers_mod
from proxray.routing.index import NeighborIndex, describe_index, exact_neighbours, fit_index, normalize


@pytest.fixture
def small_limits(monkeypatch):
    monkeypatch.setattr(index_mod, "EXACT_MAX", 500)
    monkeypatch.setattr(routers_mod, "KMEANS_ALL_ROWS_MAX", 500)
    # at a few thousand references exact search is faster than any graph: time it as at a million (112 ms)
    monkeypatch.setattr(index_mod, "exact_route_ms", lambda *a, **k: 112.0)


def refs(rng, n=3000, d=32):
    X, acc, cost, labels = blobs(rng, n_per=n // 10, centers=10, dim=d, spread=0.3)
    return X, acc, cost


def test_small_sets_are_searched_exactly(rng):
    X, acc, cost = refs(rng, 400)
    r = KNNRouter(k=20).fit(X, acc, cost)
    assert r.index_info_["kind"] == "flat" and r.index_.kind == "flat" and r.index_info_["recall_at_k"] == 1.0


def test_above_the_limit_an_approximate_index_reaches_the_floor_and_the_artifact_keeps_it(rng, small_limits, tmp_path,
                                                                                         monkeypatch):
    X, acc, cost = refs(rng)
    # a budget no busy machine exceeds: the regret bound, not the clock, decides here (timings: bench/bench_scale.py)
    r = KNNRouter(k=20, route_budget_ms=50.0).fit(X, acc, cost)
    info = r.index_info_
    assert info["kind"] == index_mod.AUTO_APPROX and info["sample"] == 300 and info["lams"] == 16
    assert info["decision_regret"] <= 0.005 and info["max_regret"] == 0.005 and info["recall_at_k"] >= 0.9
    assert 0 < info["route_ms"] <= info["budget_ms"] == 50.0 and "warning" not in info
    assert info["trials"][-1]["ef_search"] == info["ef_search"]  # what it tried, the last the one kept
    # on fresh queries near the references it holds too (a margin for the sample's 256)
    Q = normalize(X[rng.choice(len(X), 200)] + 0.05 * rng.normal(size=(200, X.shape[1])).astype(np.float32))
    _, approx = r.index_.search(Q, 20)
    exact = exact_neighbours(Q, r.reference_, 20, "cosine")
    assert np.mean([len(np.intersect1d(a, e)) / 20 for a, e in zip(approx, exact)]) >= 0.9
    before = r.estimate(Q)
    v = r.save(tmp_path / "r")
    manifest = json.loads((v / "manifest.json").read_text())
    assert manifest["index"]["kind"] == info["kind"] and manifest["index"]["recall_at_k"] == info["recall_at_k"]
    assert "index" in manifest["files"]
    monkeypatch.setattr(NeighborIndex, "add", lambda *a: pytest.fail("loading rebuilt the index"))
    loaded = KNNRouter.load(tmp_path / "r")
    assert loaded.index_info_ == info
    for x, y in zip(loaded.estimate(Q), before):
        np.testing.assert_allclose(x, y, rtol=1e-6)


def test_the_index_is_chosen_by_what_its_decisions_lose_not_by_recall(rng, small_limits, monkeypatch):
    """Structureless references: where every neighbour carries the same labels, any neighbours route the same — the
    narrowest search is kept whatever its recall; where each reference's labels are its own, a tight bound widens the
    search until the changed decisions lose no more than it, and the recall reached then is what they needed."""
    monkeypatch.setattr(index_mod, "MIN_EF_SEARCH", 4)  # a narrow first search, below what recall asks for
    R = normalize(rng.normal(size=(3000, 64)).astype(np.float32))
    flat = np.tile([[0.9, 0.5, 0.2]], (3000, 1))
    # budgets no busy machine exceeds: what the decisions lose, not the clock, decides here
    same = KNNRouter(k=20, route_budget_ms=50.0).fit(R, flat, np.tile([[3e-3, 1e-3, 1e-4]], (3000, 1)))
    info = same.index_info_
    print("same labels:", info)
    assert info["kind"] == "hnsw" and info["ef_search"] == index_mod.MIN_EF_SEARCH and info["decision_regret"] == 0
    assert info["recall_at_k"] < 0.95  # a recall floor of 0.95 would have widened it for nothing
    acc, cost = rng.uniform(size=(3000, 3)), rng.uniform(size=(3000, 3)) * 1e-3
    loose = KNNRouter(k=20, route_budget_ms=50.0).fit(R, acc, cost).index_info_
    own = KNNRouter(k=20, max_regret=0.0005, route_budget_ms=50.0).fit(R, acc, cost).index_info_
    print("own labels:", loose, own)
    assert loose["trials"][0]["decision_regret"] > 0.0005  # the narrowest search loses more than the tight bound
    assert own["ef_search"] > loose["ef_search"] and own["decision_regret"] <= 0.0005 < own["trials"][0]["decision_regret"]
    assert own["decision_regret"] < loose["decision_regret"] and own["recall_at_k"] > loose["recall_at_k"]
    strict = KNNRouter(k=20, max_regret=0.0, recall_floor=0.9, route_budget_ms=50.0).fit(R, flat, flat * 1e-3)
    assert strict.index_info_["recall_at_k"] >= 0.9  # a floor asked for still holds


def test_where_no_setting_meets_the_bound_in_the_budget_the_least_regret_under_it_and_a_warning(rng, small_limits,
                                                                                                 monkeypatch):
    """Labels of its own per reference, no regret allowed and a widest search that still changes decisions: no setting
    meets the bound. The least regret of those searched under the budget is kept, and fit and info say so."""
    monkeypatch.setattr(index_mod, "MAX_EF_SEARCH", 96)
    R = normalize(rng.normal(size=(3000, 64)).astype(np.float32))
    acc, cost = rng.uniform(size=(3000, 3)), rng.uniform(size=(3000, 3)) * 1e-3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = KNNRouter(k=20, max_regret=0.0, route_budget_ms=50.0).fit(R, acc, cost)
    info = r.index_info_
    print(info)
    under = [t for t in info["trials"] if t["route_ms"] <= 50.0]
    assert info["kind"] == "hnsw" and len(under) >= 2 and info["decision_regret"] > 0
    assert info["decision_regret"] == min(t["decision_regret"] for t in under)
    assert [str(w.message) for w in caught if "KNNRouter index" in str(w.message)] == [f"KNNRouter index: {info['warning']}"]
    assert "no hnsw setting met regret <= 0 within 50 ms" in info["warning"] and "exact search: 112 ms" in info["warning"]
    line = describe_index(info)
    assert line.splitlines()[1] == f"warning: {info['warning']}" and "accuracy points" in line


def test_exact_search_is_chosen_where_it_fits_the_budget_and_is_faster(rng, monkeypatch):
    """Above EXACT_MAX, a reference set small enough that exact search routes faster than the graph: exact search,
    no regret. The two are timed as a quiet machine times them (the decision, not the clock, is what is tested here;
    bench/bench_scale.py measures them)."""
    monkeypatch.setattr(index_mod, "EXACT_MAX", 500)
    monkeypatch.setattr(index_mod, "exact_route_ms", lambda *a, **k: 0.05)
    monkeypatch.setattr(index_mod, "route_ms", lambda *a, **k: 0.12)
    X, acc, cost = refs(rng)
    info = KNNRouter(k=20).fit(X, acc, cost).index_info_
    print(info)
    assert info["kind"] == "flat" and info["route_ms"] < info["trials"][-1]["route_ms"]
    assert info["chosen"].startswith("auto: exact search takes") and "faster than hnsw" in info["chosen"]


def test_live_growth_keeps_the_index_valid(rng, small_limits):
    X, acc, cost = refs(rng)
    r = KNNRouter(k=20).fit(X[:2500], acc[:2500], cost[:2500])
    r.add_queries(X[2500:], acc[2500:], cost[2500:])
    _, idx = r.index_.search(r.reference_[2500:2600], 1)
    assert r.n_train_ == 3000 and (idx[:, 0] >= 2500).mean() >= 0.95  # the added references are found


def test_a_floor_out_of_reach(rng, small_limits, monkeypatch):
    R = normalize(rng.normal(size=(3000, 32)).astype(np.float32))  # no structure: hard for any approximate index
    with pytest.raises(ValueError, match=r"index='ivf': .* it reached recall@20 0\.\d+ against exact search, not "
                                         r"regret <= 0.005, recall@20 >= 0.999; raise nprobe"):
        fit_index(R, "cosine", "ivf", 20, floor=0.999, nprobe=1)
    monkeypatch.setattr(index_mod, "MIN_EF_SEARCH", 4)
    monkeypatch.setattr(index_mod, "MAX_EF_SEARCH", 4)
    monkeypatch.setattr(index_mod, "exact_route_ms", lambda *a, **k: 0.5)  # within the budget
    index, info = fit_index(R, "cosine", "auto", 20, floor=0.999)
    assert index.kind == "flat" and info["chosen"] == "auto: exact search takes 0.5 ms, and no hnsw setting met " \
        "regret <= 0.005, recall@20 >= 0.999"
    with pytest.raises(ValueError, match="recall_floor=1.5: must be a number from 0 to 1"):
        KNNRouter(k=5, recall_floor=1.5).fit(R[:50], rng.uniform(size=(50, 2)))


def test_kmeans_on_a_sample_above_its_row_limit(rng, small_limits):
    X, acc, cost, labels = blobs(rng, n_per=300, centers=6, dim=16, spread=0.05)
    km = KMeansRouter(n_clusters=6).fit(X, acc, cost)
    assert km.centers_.shape == (6, 16) and sorted(np.bincount(km.labels_)) == [300] * 6  # the blobs, found
    # the same clusters as scikit-learn's fit on every row (which it still uses below the limit)
    full = KMeansRouter(n_clusters=6)
    routers_mod.KMEANS_ALL_ROWS_MAX = 10**9
    full.fit(X, acc, cost)
    np.testing.assert_allclose(np.sort(km.sizes_), np.sort(full.sizes_))
    np.testing.assert_allclose(np.sort(km.acc_values_, axis=0), np.sort(full.acc_values_, axis=0), atol=1e-9)
