import numpy as np
import pytest

from conftest import blobs
from proxray import ArtifactError, KMeansRouter, KNNRouter, choose
from sklearn.exceptions import NotFittedError

from proxray.routing.artifact import current_version, versions
from proxray.routing.index import NeighborIndex, normalize, recall_at_k


def split(rng, X, acc, cost, n_test=40):
    idx = rng.permutation(len(X))
    te, tr = idx[:n_test], idx[n_test:]
    return X[tr], acc[tr], cost[tr], X[te], acc[te], cost[te]


def test_kmeans_tau_to_zero_equals_hard_nearest_cluster(rng):
    X, acc, cost, _ = blobs(rng)
    base = KMeansRouter(n_clusters=6, weighting="base").fit(X, acc, cost)
    prox0 = KMeansRouter(n_clusters=6, weighting="prox", temperature=np.inf).fit(X, acc, cost)
    Xq = normalize(rng.normal(size=(30, X.shape[1])).astype(np.float32))
    # the hard router by hand: the values of the nearest centroid
    nearest = np.argmin(1 - Xq @ base.centers_.T, axis=1)
    a, c = base.estimate(Xq)
    np.testing.assert_allclose(a, base.acc_values_[nearest])
    np.testing.assert_allclose(c, base.cost_values_[nearest])
    np.testing.assert_allclose(prox0.estimate(Xq)[0], a)


def test_knn_prox_tau_to_infinity_equals_uniform_knn(rng):
    X, acc, cost, _ = blobs(rng)
    Xtr, atr, ctr, Xq, _, _ = split(rng, X, acc, cost)
    base = KNNRouter(k=15, weighting="base").fit(Xtr, atr, ctr)
    prox_inf = KNNRouter(k=15, weighting="prox", temperature=0.0).fit(Xtr, atr, ctr)
    # uniform kNN by hand
    d = 1 - Xq @ Xtr.T
    nn = np.argsort(d, axis=1)[:, :15]
    np.testing.assert_allclose(base.estimate(Xq)[0], atr[nn].mean(1), atol=1e-12)
    np.testing.assert_allclose(prox_inf.estimate(Xq)[0], atr[nn].mean(1), atol=1e-12)
    np.testing.assert_allclose(prox_inf.estimate(Xq)[1], ctr[nn].mean(1), atol=1e-12)


def test_knn_prox_by_hand(rng):
    X, acc, cost, _ = blobs(rng)
    Xtr, atr, ctr, Xq, _, _ = split(rng, X, acc, cost)
    r = KNNRouter(k=10, temperature=20.0).fit(Xtr, atr, ctr)
    d = 1 - Xq @ Xtr.T
    nn = np.argsort(d, axis=1)[:, :10]
    w = np.exp(-20 * np.take_along_axis(d, nn, 1))
    w /= w.sum(1, keepdims=True)
    np.testing.assert_allclose(r.estimate(Xq)[0], np.einsum("qk,qkm->qm", w, atr[nn]), atol=1e-6)


def test_kmeans_one_cluster_per_point_uniform_prior_equals_knn_over_all(rng):
    X, acc, cost, _ = blobs(rng, n_per=10, centers=3)
    Xq = normalize(rng.normal(size=(25, X.shape[1])).astype(np.float32))
    n = len(X)
    km = KMeansRouter(n_clusters=n, prior="uniform", temperature=7.0).fit(X, acc, cost)
    assert (km.sizes_ == 1).all()
    knn = KNNRouter(k=n, temperature=7.0).fit(X, acc, cost)
    for a, b in zip(km.estimate(Xq), knn.estimate(Xq)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_kmeans_prior_is_size_over_spread(rng):
    X, acc, cost, _ = blobs(rng)
    r = KMeansRouter(n_clusters=4).fit(X, acc, cost)
    d = 1 - np.sum(normalize(X) * r.centers_[r.labels_], axis=1)
    for i in range(4):
        m = r.labels_ == i
        assert r.sizes_[i] == m.sum()
        assert r.spreads_[i] == pytest.approx(d[m].mean(), rel=1e-4)
        np.testing.assert_allclose(r.acc_values_[i], acc[m].mean(0))
    p = r.sizes_ / r.spreads_
    np.testing.assert_allclose(r.prior_, p / p.sum())


def test_kmeans_prior_floors_a_one_member_cluster_whatever_its_rounding(rng):
    """A one-member cluster's spread is 0, or in float32 a rounding remainder of its member's distance to itself
    (1.19e-7 on bbh19_dev at two BLAS threads, 0 at one): either way it is floored at the smallest real spread, so
    one training query cannot take the prior (with the remainder taken as a spread it took 99.6 % there)."""
    X, acc, cost, _ = blobs(rng, n_per=30, centers=3)
    far = -X[:1]  # one query opposite the first blob: a cluster of its own
    r = KMeansRouter(n_clusters=4, random_state=0).fit(np.vstack([X, far]), np.vstack([acc, acc[:1]]),
                                                       np.vstack([cost, cost[:1]]))
    single = int(np.flatnonzero(r.sizes_ == 1)[0])
    others = np.arange(4) != single
    floor = r.spreads_[others].min()
    expected = np.where(others, r.sizes_ / np.maximum(r.spreads_, floor), 1.0 / floor)
    for remainder in (0.0, 1.19e-7, 1e-4):  # the real spreads here are ~0.02
        r.spreads_ = r.spreads_.copy()
        r.spreads_[single] = remainder
        np.testing.assert_allclose(r.prior_, expected / expected.sum(), rtol=1e-12)
        assert r.prior_[single] < r.prior_[others].min()


def test_prox_beats_base_on_far_queries_of_a_smooth_task(rng):
    """Values vary smoothly along a direction; outlier queries sit beyond the training range.
    Hard nearest-cluster routing extrapolates badly, the tilted average less so (the paper's claim)."""
    d = 8
    t = rng.uniform(-1, 1, 600)
    X = np.zeros((600, d), np.float32)
    X[:, 0], X[:, 1] = np.cos(t), np.sin(t)
    X += 0.02 * rng.normal(size=X.shape).astype(np.float32)
    p_good = 1 / (1 + np.exp(-4 * t))
    acc = np.stack([(rng.uniform(size=600) < p_good), (rng.uniform(size=600) < 1 - p_good)], 1).astype(float)
    base = KMeansRouter(n_clusters=16, weighting="base").fit(X, acc)
    prox = KMeansRouter(n_clusters=16, weighting="prox", temperature=20).fit(X, acc)
    tq = np.linspace(-1, 1, 200)
    Xq = np.stack([np.cos(tq), np.sin(tq)] + [np.zeros(200)] * (d - 2), 1).astype(np.float32)
    truth = np.stack([1 / (1 + np.exp(-4 * tq)), 1 / (1 + np.exp(4 * tq))], 1)
    err_base = np.abs(base.estimate(Xq)[0] - truth).mean()
    err_prox = np.abs(prox.estimate(Xq)[0] - truth).mean()
    assert err_prox < err_base


def test_route_lambda_scalar_array_and_allowed(rng):
    X, acc, cost, _ = blobs(rng)
    r = KNNRouter(k=20).fit(X, acc, cost)
    a, c = r.estimate(X[:5])
    np.testing.assert_array_equal(r.route(X[:5], lam=0.0), choose(a, c, 0.0))
    lam = np.array([0.0, 0.0, 1e6, 1e6, 0.0])
    ch = r.route(X[:5], lam=lam)
    assert (ch[[2, 3]] == 0).all()  # model 0 is the cheapest: a huge λ picks it
    only2 = np.array([False, False, True])
    assert (r.route(X[:5], lam=0.0, allowed=only2) == 2).all()
    with pytest.raises(ValueError, match="lam has 2 values"):
        r.route(X[:5], lam=np.zeros(2))
    with pytest.raises(ValueError, match=">= 0"):
        r.route(X[:5], lam=-1.0)


def test_choose_breaks_ties_by_cost():
    acc = np.array([[0.5, 0.5, 0.4]])
    cost = np.array([[2.0, 1.0, 0.1]])
    assert choose(acc, cost, 0.0)[0] == 1


def test_fit_validation_errors(rng):
    X, acc, cost, _ = blobs(rng)
    with pytest.raises(ValueError, match=r"acc must be finite values in \[0, 1\]"):
        KNNRouter().fit(X, acc + 1, cost)
    with pytest.raises(ValueError, match="cost must be finite values >= 0"):
        KNNRouter().fit(X, acc, -cost)
    with pytest.raises(ValueError, match="weighting='soft'"):
        KNNRouter(weighting="soft").fit(X, acc, cost)
    with pytest.raises(ValueError, match="metric='l1'"):
        KMeansRouter(metric="l1").fit(X, acc, cost)
    with pytest.raises(ValueError, match="n_clusters=1000"):
        KMeansRouter(n_clusters=1000).fit(X, acc, cost)
    with pytest.raises(ValueError, match="dimension 3"):
        KNNRouter().fit(X, acc, cost).estimate(X[:, :3])
    with pytest.raises(NotFittedError, match="not fitted"):
        KNNRouter().estimate(X)
    with pytest.raises(ValueError, match="temperature='warm': expected a number"):
        KNNRouter(temperature="warm").fit(X, acc, cost)
    with pytest.raises(ValueError, match="does not apply to router='knn': its temperatures are fixed, spread"):
        KNNRouter(temperature="plug-in:0.125").fit(X, acc, cost)
    with pytest.raises(ValueError, match=r"temperature plug-in:inf: must be a finite number >= 0 \(the bias term's weight c\)"):
        KMeansRouter(temperature="plug-in:inf").fit(X, acc, cost)


def test_no_cost_tables(rng):
    X, acc, _, _ = blobs(rng)
    r = KMeansRouter(n_clusters=4).fit(X, acc)
    a, c = r.estimate(X[:3])
    assert not r.has_cost_ and (c == 0).all() and a.shape == (3, 3)


@pytest.mark.parametrize("cls,kw", [(KNNRouter, {"k": 12}), (KMeansRouter, {"n_clusters": 4})])
def test_add_queries_matches_refit(rng, cls, kw):
    X, acc, cost, _ = blobs(rng)
    Xq = X[:10]
    r = cls(**kw).fit(X[:150], acc[:150], cost[:150])
    r.add_queries(X[150:], acc[150:], cost[150:])
    if cls is KNNRouter:
        full = cls(**kw).fit(X, acc, cost)
    else:  # same centroids, statistics over all points
        full = cls(**kw).fit(X[:150], acc[:150], cost[:150])
        labels = np.argmin(1 - normalize(X) @ full.centers_.T, 1)
        full._assign_fit(normalize(X), labels, acc, cost)
    assert r.n_train_ == len(X)
    for a, b in zip(r.estimate(Xq), full.estimate(Xq)):
        np.testing.assert_allclose(a, b, atol=1e-9)


@pytest.mark.parametrize("cls,kw", [(KNNRouter, {"k": 12}), (KMeansRouter, {"n_clusters": 4})])
def test_add_model_matches_refit(rng, cls, kw):
    X, acc, cost, _ = blobs(rng, models=4)
    r = cls(**kw).fit(X, acc[:, :3], cost[:, :3], models=["a", "b", "c"])
    r.add_model("d", acc[:, 3], cost[:, 3])
    full = cls(**kw).fit(X, acc, cost, models=["a", "b", "c", "d"])
    assert r.models_ == ["a", "b", "c", "d"]
    for a, b in zip(r.estimate(X[:10]), full.estimate(X[:10])):
        np.testing.assert_allclose(a, b, atol=1e-9)
    with pytest.raises(ValueError, match="already"):
        r.add_model("d", acc[:, 3], cost[:, 3])
    with pytest.raises(ValueError, match="needs the new model's cost"):
        r.add_model("e", acc[:, 3])


@pytest.mark.parametrize("cls,kw", [(KNNRouter, {"k": 12, "metric": "euclidean"}),
                                    (KMeansRouter, {"n_clusters": 5, "weighting": "base"})])
def test_save_load_roundtrip(tmp_path, rng, cls, kw):
    X, acc, cost, _ = blobs(rng)
    r = cls(**kw).fit(X, acc, cost, models=["x", "y", "z"], encoder_id="enc-a")
    r.save(tmp_path / "r")
    r2 = cls.load(tmp_path / "r", encoder_id="enc-a")
    assert r2.models_ == ["x", "y", "z"] and r2.get_params() == r.get_params()
    for a, b in zip(r.estimate(X[:20]), r2.estimate(X[:20])):
        np.testing.assert_array_equal(a, b)


def test_corrupted_or_mismatched_artifacts_fail_clearly(tmp_path, rng):
    X, acc, cost, _ = blobs(rng)
    KNNRouter(k=5).fit(X, acc, cost, encoder_id="enc-a").save(tmp_path / "r")
    with pytest.raises(ArtifactError, match="encoder 'enc-a', not 'enc-b'"):
        KNNRouter.load(tmp_path / "r", encoder_id="enc-b")
    with pytest.raises(ArtifactError, match="holds a KNNRouter, not a KMeansRouter"):
        KMeansRouter.load(tmp_path / "r")
    f = current_version(tmp_path / "r") / "acc_values.npy"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="acc_values.npy: checksum mismatch"):
        KNNRouter.load(tmp_path / "r")
    f.unlink()
    with pytest.raises(ArtifactError, match="missing"):
        KNNRouter.load(tmp_path / "r")
    (current_version(tmp_path / "r") / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        KNNRouter.load(tmp_path / "r")
    with pytest.raises(ArtifactError, match="no manifest.json"):
        KNNRouter.load(tmp_path / "nothing")


def test_resaving_never_destroys_the_version_in_use(tmp_path, rng, monkeypatch):
    """A save that crashes after its first array leaves the previous version loadable and in use; a
    save that finishes adds a version beside the old ones and switches CURRENT to it."""
    import proxray.routing.artifact as artifact

    X, acc, cost, _ = blobs(rng)
    first = KNNRouter(k=5).fit(X, acc, cost)
    first.save(tmp_path / "r")
    v1 = current_version(tmp_path / "r")
    second = KNNRouter(k=7).fit(X[::2], acc[::2], cost[::2])
    real_save, calls = np.save, []

    def crash_after_first(*a, **kw):
        calls.append(a[0])
        if len(calls) > 1:
            raise OSError("disk full (simulated crash)")
        real_save(*a, **kw)

    monkeypatch.setattr(artifact.np, "save", crash_after_first)
    with pytest.raises(OSError, match="simulated crash"):
        second.save(tmp_path / "r")
    monkeypatch.setattr(artifact.np, "save", real_save)
    assert current_version(tmp_path / "r") == v1
    assert KNNRouter.load(tmp_path / "r").get_params()["k"] == 5  # checksums hold: the old version is untouched
    second.save(tmp_path / "r")
    assert KNNRouter.load(tmp_path / "r").n_train_ == len(X[::2])
    assert versions(tmp_path / "r") == sorted([v1.name, current_version(tmp_path / "r").name])
    assert KNNRouter.load(v1).get_params()["k"] == 5  # an old version still loads by its own path
    (tmp_path / "r" / "CURRENT").write_text("../../etc")
    with pytest.raises(ArtifactError, match="is not a version name"):
        KNNRouter.load(tmp_path / "r")


def test_approximate_indexes_recall(rng):
    R = normalize(rng.normal(size=(5000, 32)).astype(np.float32))
    Q = normalize(rng.normal(size=(200, 32)).astype(np.float32))
    exact = NeighborIndex(32, kind="flat")
    exact.add(R)
    d_exact, i_exact = exact.search(Q, 20)
    for kind, floor in (("hnsw", 0.9), ("ivf", 0.75)):
        idx = NeighborIndex(32, kind=kind, nprobe=32)
        idx.add(R)
        d, i = idx.search(Q, 20)
        rec = recall_at_k(i, i_exact)
        assert rec >= floor, (kind, rec)
        assert np.all(d[i >= 0] >= d_exact[:, :1].min() - 1e-5)
    r = KNNRouter(k=20, index="hnsw").fit(R, rng.uniform(size=(5000, 2)))
    assert r.estimate(Q)[0].shape == (200, 2)


@pytest.mark.parametrize("cls,kw", [(KNNRouter, {"k": 12}), (KMeansRouter, {"n_clusters": 4})])
def test_estimate_with_outlier_score_is_both_in_one(rng, cls, kw):
    X, acc, cost, _ = blobs(rng)
    r = cls(**kw).fit(X[:200], acc[:200], cost[:200])
    a, c, o = r.estimate_with_outlier_score(X[200:])
    for x, y in zip((a, c, o), (*r.estimate(X[200:]), r.outlier_score(X[200:]))):
        np.testing.assert_array_equal(x, y)
    assert (r.outlier_score(X[:5]) < 1e-5).all() if cls is KNNRouter else (o >= 0).all()


def test_fewer_training_points_than_k_is_an_error_before_the_index(rng, monkeypatch):
    import proxray.routing.knn as routers

    X, acc, cost, _ = blobs(rng, n_per=2, centers=2)
    monkeypatch.setattr(routers, "fit_index", lambda *a, **kw: pytest.fail("the index was built"))
    for k in (100, 0, 2.5, True):
        with pytest.raises(ValueError, match=r"k=.*integer from 1 to the training queries' number \(4\); pass k=4"):
            KNNRouter(k=k).fit(X, acc, cost)
    monkeypatch.undo()
    r = KNNRouter(k=4).fit(X, acc, cost)
    assert r.k_ == 4
    np.testing.assert_allclose(r.weights(X[:2])[0].sum(1), 1.0)


def test_km_prox_estimates_follow_the_formula_with_the_spread_prior(rng):
    """End to end: membership, n_i, s_i, V_i, the spread prior and the weights all in the routing distance
    (cosine to the unit centroids), recomputed here by hand."""
    from sklearn.cluster import KMeans

    X, acc, cost, _ = blobs(rng, n_per=40, centers=5, spread=2.0)  # overlapping clusters
    X = X * rng.uniform(0.5, 3.0, size=(len(X), 1))  # raw rows of different lengths: euclidean != cosine
    r = KMeansRouter(n_clusters=6, temperature=20.0, prior="spread", random_state=3).fit(X, acc, cost)
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    C = r.centers_
    np.testing.assert_allclose(np.linalg.norm(C, axis=1), 1.0, rtol=1e-5)
    D = 1.0 - U @ C.T
    labels = D.argmin(1)
    np.testing.assert_array_equal(r.labels_, labels)  # the same distance as routing and add_queries
    # sklearn's own labels (euclidean to the raw centroids) put some query elsewhere: the case this guards
    assert (KMeans(n_clusters=6, random_state=3, n_init=3).fit(U).labels_ != labels).any()
    K = len(C)
    n = np.bincount(labels, minlength=K).astype(float)
    s = np.bincount(labels, weights=D[np.arange(len(U)), labels], minlength=K) / np.maximum(n, 1)
    V = np.stack([acc[labels == i].mean(0) if n[i] else np.zeros(acc.shape[1]) for i in range(K)])
    W = np.stack([cost[labels == i].mean(0) if n[i] else np.zeros(acc.shape[1]) for i in range(K)])
    floor = s[(n > 0) & (s > 0)].min()
    prior = np.where(n > 0, n / np.maximum(s, floor), 0.0)
    prior /= prior.sum()
    Q = rng.normal(size=(7, X.shape[1])).astype(np.float32)
    Qu = Q / np.linalg.norm(Q, axis=1, keepdims=True)
    phi = np.clip(1.0 - Qu @ C.T, 0, 2)
    w = prior * np.exp(-20.0 * phi)
    w /= w.sum(1, keepdims=True)
    acc_hat, cost_hat = r.estimate(Q)
    np.testing.assert_allclose(acc_hat, w @ V, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(cost_hat, w @ W, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["knn", "km"])
def test_spread_temperature_is_the_formula_on_rescaled_distances(kind, tmp_path):
    """temperature Spread(c): 1/tau(x) = c / std(phi(x)), through the public steps (neighbourhood, estimate_at);
    saved and loaded; "spread:2" and Spread(2.0) are one value."""
    from proxray import KMeansRouter, KNNRouter
    from proxray.routing.registry import load_router
    from proxray.routing.temperature import Spread
    from proxray.routing.weights import proximity_weights

    rng = np.random.default_rng(5)
    X, acc = rng.normal(size=(150, 8)), rng.uniform(size=(150, 3))
    make = (lambda **kw: KNNRouter(k=20, **kw)) if kind == "knn" else (lambda **kw: KMeansRouter(n_clusters=8, **kw))
    r = make(temperature=Spread(2.0)).fit(X, acc)
    Q = rng.normal(size=(7, 8))
    nb = r.neighbourhood(Q)
    w = proximity_weights(nb.phi / nb.phi.std(axis=1, keepdims=True), 2.0, nb.prior)
    assert np.allclose(r.weights(Q)[0], w)
    assert np.allclose(r.estimate(Q)[0], r.estimate_at(w, nb)[0])
    assert np.allclose(r.estimate(Q)[0], make(temperature="spread:2").fit(X, acc).estimate(Q)[0])
    assert not np.allclose(r.estimate(Q)[0], make(temperature=2.0).fit(X, acc).estimate(Q)[0])
    r.save(tmp_path / "a")
    back = load_router(tmp_path / "a")
    assert back.temperature_ == Spread(2.0) and np.allclose(back.estimate(Q)[0], r.estimate(Q)[0])


def test_bv_temperature_is_the_plug_in_of_the_fitted_clusters(tmp_path):
    """KMeansRouter(temperature=PlugIn(c)): each query's weights are the formula at the plug-in 1/tau of its own
    cluster statistics (bias_variance_stats of n_i, V_i and the centroids); saved and loaded with nothing but the
    temperature; add_queries moves the statistics (larger clusters, smaller variance); Base ignores it; kNN and an
    infinite weight are refused by name; "auto" is it at c = 0.125 for KMeans."""
    from proxray import KMeansRouter, KNNRouter
    from proxray.routing.registry import load_router
    from proxray.routing.temperature import PLUG_IN_C as BV_WEIGHT
    from proxray.routing.temperature import PlugIn
    from proxray.routing.index import pairwise_distance
    from proxray.routing.weights import bias_variance_inv_tau, bias_variance_stats, proximity_weights

    rng = np.random.default_rng(12)
    X = np.vstack([rng.normal(loc=m, size=(60, 8)) for m in (-2.0, 0.0, 2.0)])
    acc = (rng.uniform(size=(180, 3)) < np.repeat([[0.9, 0.3, 0.5], [0.2, 0.8, 0.5], [0.5, 0.5, 0.9]], 60, 0)) * 1.0
    cost = rng.uniform(size=(180, 3))
    r = KMeansRouter(n_clusters=9, temperature=PlugIn(BV_WEIGHT)).fit(X, acc, cost)
    var, l2 = r.bias_variance_stats()
    want_var, want_l2 = bias_variance_stats(r.acc_values_, r.sizes_,
                                            pairwise_distance(r.centers_, r.centers_, r.metric))
    np.testing.assert_allclose(var, want_var)
    assert l2 == pytest.approx(want_l2)
    assert l2 > 0  # three groups of different accuracy: proximity matters
    Q = rng.normal(size=(12, 8)) * 2.5
    phi, _, prior = r.neighbourhood(Q)
    t = bias_variance_inv_tau(phi, prior, var, l2, BV_WEIGHT)
    assert len(np.unique(t)) > 1  # per query
    w = np.vstack([proximity_weights(phi[q:q + 1], t[q], prior) for q in range(len(Q))])
    np.testing.assert_allclose(r.estimate(Q)[0], w @ r.acc_values_)
    same = KMeansRouter(n_clusters=9, temperature="auto").fit(X, acc, cost)
    assert same.temperature_ == PlugIn(0.125) and BV_WEIGHT == 0.125
    np.testing.assert_allclose(r.estimate(Q)[0], same.estimate(Q)[0])
    r.save(tmp_path / "a")
    back = load_router(tmp_path / "a")
    assert back.temperature_ == PlugIn(BV_WEIGHT)
    np.testing.assert_allclose(back.estimate(Q)[0], r.estimate(Q)[0])
    grown = KMeansRouter(n_clusters=9, temperature=PlugIn(BV_WEIGHT)).fit(X, acc, cost)
    before = grown.estimate(Q)[0]  # the statistics are kept between calls until the clusters change
    assert grown.bias_variance_stats() is grown.bias_variance_stats()
    grown.add_queries(X, acc, cost)
    assert (grown.bias_variance_stats()[0] < var).all()  # twice the members: half the variance
    fresh = KMeansRouter(n_clusters=9, temperature=PlugIn(BV_WEIGHT)).fit(X, acc, cost).add_queries(X, acc, cost)
    np.testing.assert_array_equal(grown.estimate(Q)[0], fresh.estimate(Q)[0])
    assert not np.array_equal(grown.estimate(Q)[0], before)
    base = KMeansRouter(n_clusters=9, weighting="base", temperature=PlugIn(BV_WEIGHT)).fit(X, acc, cost)
    np.testing.assert_allclose(base.estimate(Q)[0], KMeansRouter(n_clusters=9, weighting="base").fit(X, acc, cost)
                               .estimate(Q)[0])
    with pytest.raises(ValueError, match="temperature='plug-in:0.125' does not apply to router='knn'"):
        KNNRouter(k=10, temperature=PlugIn(BV_WEIGHT)).fit(X, acc, cost)
    with pytest.raises(ValueError, match="plug-in:inf: must be a finite number >= 0"):
        KMeansRouter(n_clusters=9, temperature=PlugIn(float("inf"))).fit(X, acc, cost)


def test_the_earlier_temperature_spellings_still_work_with_a_deprecation(tmp_path, rng):
    """inv_tau= / tau= / temperature="spread" with inv_tau: the same router as today's one typed temperature, with a
    DeprecationWarning that names it; an artifact saved with those hyperparameters loads as what it meant, and one
    saved with the study's "ess" fails with what to do."""
    import json

    from proxray.routing.artifact import ArtifactError
    from proxray.routing.registry import load_router
    from proxray.routing.temperature import Fixed, PlugIn, Spread

    X, acc, cost, _ = blobs(rng)
    cases = [(KNNRouter, dict(k=12, inv_tau=7.0), Fixed(7.0)), (KNNRouter, dict(k=12, tau=0.5), Fixed(2.0)),
             (KNNRouter, dict(k=12, inv_tau=0.2, temperature="spread"), Spread(0.2)),
             (KMeansRouter, dict(n_clusters=4, inv_tau=0.125, temperature="bv"), PlugIn(0.125))]
    for cls, kw, want in cases:
        with pytest.warns(DeprecationWarning, match=f"say temperature='{want.spec}'"):
            old = cls(**kw).fit(X, acc, cost)
        assert old.temperature_ == want
        np.testing.assert_array_equal(old.estimate(X[:9])[0], cls(**{k: v for k, v in kw.items() if k in ("k", "n_clusters")},
                                                                  temperature=want).fit(X, acc, cost).estimate(X[:9])[0])
        # an artifact as the earlier version wrote it: inv_tau / tau / temperature name in params, no "temperature" field
        old.save(tmp_path / want.kind)
        folder = current_version(tmp_path / want.kind)
        m = json.loads((folder / "manifest.json").read_text())
        params = {k: v for k, v in m["params"].items() if k != "temperature"}
        m["params"] = {**params, "inv_tau": want.value, "tau": None, "temperature": {"plug-in": "bv"}.get(want.kind, want.kind)}
        del m["temperature"]
        (folder / "manifest.json").write_text(json.dumps(m))
        back = load_router(tmp_path / want.kind)
        assert back.temperature_ == want
        np.testing.assert_array_equal(back.estimate(X[:9])[0], old.estimate(X[:9])[0])
    m["params"]["temperature"] = "ess"
    (folder / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="temperature 'ess' .* re-fit with temperature='auto'"):
        load_router(tmp_path / want.kind)


def test_the_plug_in_temperatures_earlier_name_still_parses_and_says_so():
    from proxray.routing.temperature import PlugIn, parse_temperature

    with pytest.warns(DeprecationWarning, match="temperature 'bv:0.3' is deprecated: say 'plug-in:0.3'"):
        assert parse_temperature("bv:0.3", KMeansRouter) == PlugIn(0.3)
