import numpy as np
import pytest

from conftest import blobs
from proxray import ArtifactError, KMeansRouter, KNNRouter, choose
from proxray.artifact import current_version, versions
from proxray.index import NeighborIndex, normalize, recall_at_k


def split(rng, X, acc, cost, n_test=40):
    idx = rng.permutation(len(X))
    te, tr = idx[:n_test], idx[n_test:]
    return X[tr], acc[tr], cost[tr], X[te], acc[te], cost[te]


def test_kmeans_tau_to_zero_equals_hard_nearest_cluster(rng):
    X, acc, cost, _ = blobs(rng)
    base = KMeansRouter(n_clusters=6, weighting="base").fit(X, acc, cost)
    prox0 = KMeansRouter(n_clusters=6, weighting="prox", tau=0).fit(X, acc, cost)
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
    prox_inf = KNNRouter(k=15, weighting="prox", tau=np.inf).fit(Xtr, atr, ctr)
    # uniform kNN by hand
    d = 1 - Xq @ Xtr.T
    nn = np.argsort(d, axis=1)[:, :15]
    np.testing.assert_allclose(base.estimate(Xq)[0], atr[nn].mean(1), atol=1e-12)
    np.testing.assert_allclose(prox_inf.estimate(Xq)[0], atr[nn].mean(1), atol=1e-12)
    np.testing.assert_allclose(prox_inf.estimate(Xq)[1], ctr[nn].mean(1), atol=1e-12)


def test_knn_prox_by_hand(rng):
    X, acc, cost, _ = blobs(rng)
    Xtr, atr, ctr, Xq, _, _ = split(rng, X, acc, cost)
    r = KNNRouter(k=10, inv_tau=20.0).fit(Xtr, atr, ctr)
    d = 1 - Xq @ Xtr.T
    nn = np.argsort(d, axis=1)[:, :10]
    w = np.exp(-20 * np.take_along_axis(d, nn, 1))
    w /= w.sum(1, keepdims=True)
    np.testing.assert_allclose(r.estimate(Xq)[0], np.einsum("qk,qkm->qm", w, atr[nn]), atol=1e-6)


def test_kmeans_one_cluster_per_point_uniform_prior_equals_knn_over_all(rng):
    X, acc, cost, _ = blobs(rng, n_per=10, centers=3)
    Xq = normalize(rng.normal(size=(25, X.shape[1])).astype(np.float32))
    n = len(X)
    km = KMeansRouter(n_clusters=n, prior="uniform", inv_tau=7.0).fit(X, acc, cost)
    assert (km.sizes_ == 1).all()
    knn = KNNRouter(k=n, inv_tau=7.0).fit(X, acc, cost)
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
    prox = KMeansRouter(n_clusters=16, weighting="prox", inv_tau=20).fit(X, acc)
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
    with pytest.raises(RuntimeError, match="not fitted"):
        KNNRouter().estimate(X)


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
    import proxray.artifact as artifact

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


def test_fewer_training_points_than_k(rng):
    X, acc, cost, _ = blobs(rng, n_per=2, centers=2)
    r = KNNRouter(k=100).fit(X, acc, cost)
    assert r.k_ == 4
    np.testing.assert_allclose(r.weights(X[:2])[0].sum(1), 1.0)


def test_km_prox_estimates_follow_the_formula_with_the_spread_prior(rng):
    """End to end: membership, n_i, s_i, V_i, the spread prior and the weights all in the routing distance
    (cosine to the unit centroids), recomputed here by hand."""
    from sklearn.cluster import KMeans

    X, acc, cost, _ = blobs(rng, n_per=40, centers=5, spread=2.0)  # overlapping clusters
    X = X * rng.uniform(0.5, 3.0, size=(len(X), 1))  # raw rows of different lengths: euclidean != cosine
    r = KMeansRouter(n_clusters=6, inv_tau=20.0, prior="spread", random_state=3).fit(X, acc, cost)
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


def test_estimates_over_fixed_relative_spread_and_mixed_temperatures():
    """tuning.estimates_over: a number is the router's own estimate at that 1/tau; rel:a and spr:a are the
    formula with phi scaled per query by its nearest distance / by the std of its distances; mix:a,b the
    mean of the weights at a and b."""
    from proxray import KNNRouter
    from proxray.tuning import RELATIVE_FLOOR, estimates_over
    from proxray.weights import proximity_weights

    rng = np.random.default_rng(3)
    X, acc = rng.normal(size=(120, 8)), rng.uniform(size=(120, 3))
    r = KNNRouter(k=15, inv_tau=7.0).fit(X, acc)
    Q = rng.normal(size=(6, 8))
    (fixed, _), (rel, _), (spr, _), (mix, _) = estimates_over(r, Q, [7.0, "rel:2", "spr:0.5", "mix:0,7"])
    assert np.allclose(fixed, r.estimate(Q)[0])
    phi, ref, _ = r._search(Q)
    uniform = acc[ref].mean(axis=1)  # 1/tau = 0: the k neighbours' plain mean
    assert np.allclose(mix, (uniform + fixed) / 2) and not np.allclose(mix, fixed)
    for got, scale, a in ((rel, np.maximum(phi.min(1), RELATIVE_FLOOR), 2.0), (spr, phi.std(1), 0.5)):
        w = proximity_weights(phi / scale[:, None], a, None)
        want = np.einsum("qk,qkm->qm", w, acc[ref])
        assert np.allclose(got, want)


@pytest.mark.parametrize("kind", ["knn", "km"])
def test_spread_temperature_is_the_formula_on_rescaled_distances(kind, tmp_path):
    """temperature="spread": 1/tau(x) = inv_tau / std(phi(x)); the same as tuning's spr:a, saved and loaded."""
    from proxray import KMeansRouter, KNNRouter
    from proxray.artifact import load_router
    from proxray.tuning import estimates_over
    from proxray.weights import proximity_weights

    rng = np.random.default_rng(5)
    X, acc = rng.normal(size=(150, 8)), rng.uniform(size=(150, 3))
    make = (lambda **kw: KNNRouter(k=20, **kw)) if kind == "knn" else (lambda **kw: KMeansRouter(n_clusters=8, **kw))
    r = make(inv_tau=2.0, temperature="spread").fit(X, acc)
    Q = rng.normal(size=(7, 8))
    phi, ref, prior = r._search(Q)
    w = proximity_weights(phi / phi.std(axis=1, keepdims=True), 2.0, prior)
    assert np.allclose(r.weights(Q)[0], w)
    assert np.allclose(r.estimate(Q)[0], next(estimates_over(make(inv_tau=20.0).fit(X, acc), Q, ["spr:2"]))[0])
    assert not np.allclose(r.estimate(Q)[0], make(inv_tau=2.0).fit(X, acc).estimate(Q)[0])
    r.save(tmp_path / "a")
    back = load_router(tmp_path / "a")
    assert back.temperature == "spread" and np.allclose(back.estimate(Q)[0], r.estimate(Q)[0])
    with pytest.raises(ValueError, match="temperature='warm': allowed values are fixed, spread"):
        make(temperature="warm").fit(X, acc)


def test_brier_cv_scores_the_estimates_squared_error():
    """cv_curves(score="brier"): minus the mean squared error of the accuracy estimates, per 1/tau; the Base
    limit of kNN (1/tau = 0) is the neighbours' mean, which a sharper 1/tau does not equal."""
    from proxray.tuning import brier_score, cv_curves

    assert brier_score([[0.5, 1.0]], [[0, 1]]) == pytest.approx(-12.5)
    rng = np.random.default_rng(11)
    tasks = np.repeat(np.array(["a", "b", "c"]), 40)
    X = rng.normal(size=(120, 6)) + (tasks[:, None] == "a") * 2.0
    acc = (rng.uniform(size=(120, 3)) < np.where(tasks[:, None] == "a", 0.8, 0.3)).astype(float)
    out, inl = cv_curves(X, acc, None, tasks, "knn", {"k": 20}, grid=(0.0, 5.0), score="brier")
    assert out.shape == inl.shape == (2,) and (out < 0).all() and (inl < 0).all() and out[0] != out[1]
    with pytest.raises(ValueError, match="score='auc'"):
        cv_curves(X, acc, None, tasks, "knn", {"k": 20}, score="auc")


@pytest.mark.parametrize("protocol", ["leave-task-out", "few-shot-outlier"])
def test_cv_folds_hold_out_whole_task_groups_over_repeated_splits(protocol, monkeypatch):
    """cv_curves(fold_tasks=, repeats=): each repeat partitions the eligible training tasks into groups of about
    fold_tasks (at least two); a fold trains on 80 % of the other tasks (plus, few-shot, at most few_shot shots
    drawn from the group's queries together), scores the group's other queries as outliers and the other 20 % as
    inliers; the scores are the mean over all folds of all repeats. One task of 5 queries is too small to hold out."""
    import proxray.tuning as tuning

    rng = np.random.default_rng(3)
    tasks = np.concatenate([np.repeat(np.array(list("abcdef")), 30), np.repeat(np.array(["tiny"]), 5)])
    n = len(tasks)
    X = rng.normal(size=(n, 6))
    X[:, 0] = np.arange(n)  # the row's index rides along in its first coordinate
    acc = (rng.uniform(size=(n, 3)) < 0.5).astype(float)
    fits, scored = [], []
    real_make, real_est = tuning.make_router, tuning.estimates_over

    class Recorder:
        def __init__(self, r):
            self.r = r

        def fit(self, X, *a, **kw):
            fits.append(X[:, 0].astype(int))
            self.r.fit(X, *a, **kw)
            return self

    monkeypatch.setattr(tuning, "make_router", lambda *a, **kw: Recorder(real_make(*a, **kw)))
    monkeypatch.setattr(tuning, "estimates_over",
                        lambda fitted, Xv, grid: (scored.append(Xv[:, 0].astype(int)), real_est(fitted.r, Xv, grid))[1])
    out, inl = tuning.cv_curves(X, acc, None, tasks, "knn", {"k": 10}, protocol, few_shot=7, seed=1,
                                grid=(0.0, 2.0), fold_tasks=2, repeats=3)
    assert out.shape == inl.shape == (2,)
    assert len(fits) == 3 * 3 and len(scored) == 2 * len(fits)  # 6 tasks in 3 groups of 2, 3 repeats
    held_per_repeat = [[], [], []]
    for f, (train, out_val, in_val) in enumerate(zip(fits, scored[0::2], scored[1::2])):
        group = set(tasks[out_val])
        assert len(group) == 2 and "tiny" not in group
        shots = [i for i in train if tasks[i] in group]
        assert len(shots) == (7 if protocol == "few-shot-outlier" else 0)
        assert not set(train) & set(out_val) and not set(train) & set(in_val) and not set(in_val) & set(out_val)
        assert set(out_val) | set(shots) == set(np.flatnonzero(np.isin(tasks, list(group))))  # the whole group
        others = np.flatnonzero(~np.isin(tasks, list(group)))
        assert len(in_val) == len(others) - int(0.8 * len(others))  # 20 % of the others, the rest trains
        held_per_repeat[f // 3] += sorted(group)
    assert all(sorted(h) == list("abcdef") for h in held_per_repeat)  # each task held out once per repeat
    assert len({tuple(sorted(f)) for f in fits}) == len(fits)  # the repeats draw new splits
    one = tuning.cv_curves(X, acc, None, tasks, "knn", {"k": 10}, protocol, few_shot=7, seed=1, grid=(0.0, 2.0))
    assert not np.allclose(np.concatenate(one), np.concatenate([out, inl]))
    with pytest.raises(ValueError, match="fold_tasks=0: allowed values are integers >= 1"):
        tuning.cv_curves(X, acc, None, tasks, "knn", {"k": 10}, fold_tasks=0)
    with pytest.raises(ValueError, match="repeats=1.5: allowed values are integers >= 1"):
        tuning.cv_curves(X, acc, None, tasks, "knn", {"k": 10}, repeats=1.5)


def test_cv_default_is_one_task_per_fold_in_name_order(monkeypatch):
    """Without fold_tasks / repeats the CV holds out each eligible task once, in name order (the saved
    one-pass studies); auto_inv_tau averages CV_REPEATS passes by default."""
    import proxray.tuning as tuning

    rng = np.random.default_rng(4)
    tasks = np.repeat(np.array(["c", "a", "b"]), 25)
    X, acc = rng.normal(size=(75, 5)), (rng.uniform(size=(75, 2)) < 0.5).astype(float)
    X[:, 0] = np.arange(75)
    held, calls = [], []
    real_est = tuning.estimates_over
    monkeypatch.setattr(tuning, "estimates_over", lambda f, Xv, grid: (held.append(Xv[:, 0].astype(int)), real_est(f, Xv, grid))[1])
    tuning.cv_curves(X, acc, None, tasks, "knn", {"k": 10}, grid=(0.0, 1.0))
    assert [sorted(set(tasks[h])) for h in held[0::2]] == [["a"], ["b"], ["c"]]
    real_cv = tuning.cv_folds
    monkeypatch.setattr(tuning, "cv_folds", lambda *a, **kw: (calls.append(kw.get("repeats")), real_cv(*a, **kw))[1])
    tuning.auto_inv_tau(X, acc, None, tasks, "knn", {"k": 10}, grid=(0.0, 1.0))
    assert calls == [tuning.CV_REPEATS] and tuning.CV_REPEATS == 3


def test_fold_rules_weigh_the_gain_over_base_by_its_spread_over_tasks():
    """select_inv_tau(rule="lcb"): the largest lower bound mean − se of the per-task gain over Base; "one-se":
    the 1/tau nearest Base whose mean is within one standard error of the best's. A large but erratic gain
    (1/tau = 5: +1 pp, tasks from −3 to +5) loses to a small steady one (2: +0.5 pp) under lcb, and one-se goes
    back to Base; the folds' repeats are averaged per task first."""
    from proxray.tuning import CVFolds, select_inv_tau

    grid = (0.0, 2.0, 5.0)  # kNN: Base is 1/tau = 0
    gain = {"a": (0.6, 4.0), "b": (0.4, -3.0), "c": (0.5, 5.0), "d": (0.5, -2.0)}  # per task: gain at 2, at 5
    rows, groups = [], []
    for rep in (-0.25, 0.25):  # two repeats, each task's two folds differ by +-0.25 around its gain
        for t, (g2, g5) in gain.items():
            rows.append([70.0 + rep, 70.0 + g2 + rep, 70.0 + g5 - rep])
            groups.append((t,))
    folds = CVFolds(np.array(rows), np.array(rows), tuple(groups))
    np.testing.assert_allclose(folds.by_task()[:, 2] - 70.0, [4.0, -3.0, 5.0, -2.0])
    out, inl = folds.curves()
    assert select_inv_tau(out, inl, "knn", grid, "mean") == 5.0
    assert select_inv_tau(out, inl, "knn", grid, "lcb", folds=folds) == 2.0  # 0.5 - 0.04 > 0 > 1 - 2.04
    assert select_inv_tau(out, inl, "knn", grid, "lcb", folds=folds, se_mult=0.0) == 5.0  # mean gain alone
    assert select_inv_tau(out, inl, "knn", grid, "one-se", folds=folds) == 0.0  # Base within one se of 5's
    assert select_inv_tau(out, inl, "knn", grid, "one-se", folds=folds, se_mult=0.0) == 5.0
    with pytest.raises(ValueError, match="rule='lcb' reads the CV folds apart: pass folds="):
        select_inv_tau(out, inl, "knn", grid, "lcb")
    with pytest.raises(ValueError, match=r"grid=\[2.0, 5.0\]: must contain the Base limit \(0\)"):
        two = CVFolds(np.array(rows)[:, 1:], np.array(rows)[:, 1:], tuple(groups))
        select_inv_tau(out[1:], inl[1:], "knn", (2.0, 5.0), "lcb", folds=two)
    with pytest.raises(ValueError, match="the rule needs >= 2 tasks over the 3 settings"):
        select_inv_tau(out, inl, "knn", grid, "lcb", folds=CVFolds(np.array(rows[:1]), np.array(rows[:1]), (("a",),)))


def test_cv_folds_keep_the_folds_that_cv_curves_averages():
    """cv_folds: one row per fold (repeats x task groups), its groups the held-out tasks; cv_curves is the mean."""
    from proxray.tuning import cv_curves, cv_folds

    rng = np.random.default_rng(3)
    tasks = np.repeat(np.array(["a", "b", "c"]), 30)
    X, acc = rng.normal(size=(90, 6)), (rng.uniform(size=(90, 2)) < 0.5).astype(float)
    folds = cv_folds(X, acc, None, tasks, "knn", {"k": 10}, grid=(0.0, 1.0, 5.0), repeats=2)
    assert folds.out.shape == folds.inl.shape == (6, 3)
    assert sorted(folds.groups) == [("a",), ("a",), ("b",), ("b",), ("c",), ("c",)]
    assert folds.by_task().shape == (3, 3)
    for got, want in zip(cv_curves(X, acc, None, tasks, "knn", {"k": 10}, grid=(0.0, 1.0, 5.0), repeats=2),
                         folds.curves()):
        np.testing.assert_array_equal(got, want)


def test_near_base_rule_takes_the_1_over_tau_nearest_base_within_tol():
    """select_inv_tau(rule="near-base"): among the 1/tau whose CV mean is within tol pp of the best, KMeans takes
    the largest (toward its Base limit inf), kNN the smallest (toward 0); tol 0 is the plain argmax."""
    from proxray.tuning import GRID, select_inv_tau

    mean = np.array([70.0, 71.0, 71.5, 72.2, 72.5, 72.0, 71.6, 71.0, 70.5, 70.0])  # peak at 1/tau = 10
    out, inl = mean + 1.0, mean - 1.0
    assert select_inv_tau(out, inl, "km", GRID, "mean") == 10.0
    assert select_inv_tau(out, inl, "km", GRID, "near-base", tol=1.0) == 50.0  # 71.6 >= 72.5 - 1
    assert select_inv_tau(out, inl, "knn", GRID, "near-base", tol=1.0) == 2.0  # 71.5 >= 71.5
    assert select_inv_tau(out, inl, "km", GRID, "near-base", tol=0.0) == 10.0
    assert select_inv_tau(out, inl, "km", GRID, "near-base", tol=3.0) == float("inf")  # Base itself
    # shifted: the smoothed curve peaks at 10 too (72.23), then one grid step toward Base
    assert select_inv_tau(out, inl, "km", GRID, "shifted") == 20.0
    assert select_inv_tau(out, inl, "knn", GRID, "shifted") == 5.0
    rising = np.arange(10.0)  # peaks at the KMeans limit itself: the step stays there
    assert select_inv_tau(rising, rising, "km", GRID, "shifted") == float("inf")
    assert select_inv_tau(rising[::-1], rising[::-1], "knn", GRID, "shifted") == 0.0
    with pytest.raises(ValueError, match="rule 'shifted' smooths over grid neighbours and needs an ascending grid"):
        select_inv_tau(out[:3], inl[:3], "knn", (0.0, 5.0, 2.0), "shifted")
    assert select_inv_tau(out[:3], inl[:3], "knn", (0.0, 5.0, 2.0), "near-base", tol=1.0) == 2.0  # 5 and 2 qualify: by value
    with pytest.raises(ValueError, match="rule='best': allowed values are mean, guarded, near-base, shifted, lcb, one-se"):
        select_inv_tau(out, inl, "km", GRID, "best")


@pytest.mark.parametrize("kind", ["knn", "km"])
def test_ess_temperature_gives_every_query_the_same_effective_sample_size(kind, tmp_path):
    """temperature="ess": inv_tau is the effective sample size each query's weights get (weights.ess_inv_tau),
    the same as tuning's ess:E, saved and loaded; a Base router ignores it; an ESS below 1 or infinite is refused."""
    from proxray import KMeansRouter, KNNRouter
    from proxray.artifact import load_router
    from proxray.tuning import estimates_over
    from proxray.weights import effective_sample_size

    rng = np.random.default_rng(11)
    X, acc, cost = rng.normal(size=(160, 8)), rng.uniform(size=(160, 3)), rng.uniform(size=(160, 3))
    make = (lambda **kw: KNNRouter(k=25, **kw)) if kind == "knn" else (lambda **kw: KMeansRouter(n_clusters=10, **kw))
    r = make(inv_tau=3.0, temperature="ess").fit(X, acc, cost)
    Q = rng.normal(size=(9, 8)) * 3  # near and far queries alike
    np.testing.assert_allclose(effective_sample_size(r.weights(Q)[0]), 3.0, rtol=1e-6)
    assert np.allclose(r.estimate(Q)[0], next(estimates_over(make(inv_tau=20.0).fit(X, acc, cost), Q, ["ess:3"]))[0])
    acc_hat, cost_hat, outlier = r.estimate_with_outlier_score(Q)
    assert np.allclose(acc_hat, r.estimate(Q)[0]) and np.allclose(cost_hat, r.estimate(Q)[1])
    r.save(tmp_path / "a")
    back = load_router(tmp_path / "a")
    assert (back.temperature, back.inv_tau_) == ("ess", 3.0) and np.allclose(back.estimate(Q)[0], r.estimate(Q)[0])
    base = make(weighting="base", inv_tau=3.0, temperature="ess").fit(X, acc, cost)
    assert np.allclose(base.estimate(Q)[0], make(weighting="base").fit(X, acc, cost).estimate(Q)[0])
    for bad in (0.5, float("inf")):
        with pytest.raises(ValueError, match=f"inv_tau={bad!r} with temperature='ess'.*finite number >= 1"):
            make(inv_tau=bad, temperature="ess").fit(X, acc, cost)


def test_ess_or_shifted_takes_the_adaptive_bandwidth_only_past_the_margin():
    """select_ess_or_shifted: shifted's pick over the grid unless the last CV entry (ess:ESS_TARGET) is more than
    ESS_MARGIN pp above the CV mean at that pick (the pick's, not the curve's best); curves of the wrong length are refused."""
    from proxray.tuning import ESS_MARGIN, ESS_TARGET, GRID, select_ess_or_shifted

    mean = np.array([70.0, 71.0, 71.5, 72.2, 72.5, 72.0, 71.6, 71.0, 70.5, 70.0])  # shifted picks 20 (72.0)
    for ess, want in ((72.0 + ESS_MARGIN + 0.01, (ESS_TARGET, "ess")),  # past the margin over the pick's 72.0 ...
                      (72.0 + ESS_MARGIN - 0.01, (20.0, "fixed")),  # ... not past it
                      (72.6, (ESS_TARGET, "ess"))):  # against the pick's 72.0, not the curve's best 72.5
        curve = np.append(mean, ess)
        assert select_ess_or_shifted(curve + 1.0, curve - 1.0) == want
    assert select_ess_or_shifted(np.append(mean, 72.3), np.append(mean, 72.3), margin=0.2) == (ESS_TARGET, "ess")
    with pytest.raises(ValueError, match=r"expected \(11,\), the 10 settings of the grid and then ess:3"):
        select_ess_or_shifted(mean, mean, GRID)


def test_ess_or_capped_stops_the_step_at_20_only_where_it_overshoots_a_clear_gain():
    """select_ess_or_shifted(cap=SHIFT_CAP) (rule "ess-or-capped"): a smoothed CV top at 1/tau = 20 that gains >=
    SHIFT_CAP_GAIN pp on Base keeps 20 where shifted steps to 50; a smaller gain, a top below 20 (the step lands at or
    before 20) and a top past 20 are shifted's own; the ess decision is made first, against the uncapped pick; a cap off
    the grid is refused."""
    from proxray.tuning import ESS_TARGET, GRID, SHIFT_CAP, SHIFT_CAP_GAIN, select_ess_or_shifted

    assert SHIFT_CAP == 20.0 and SHIFT_CAP_GAIN == 0.5
    top20 = np.array([69.0, 69.5, 70.0, 70.6, 71.4, 71.6, 71.3, 70.8, 70.5, 70.4])  # smoothed top at 20, Base 70.4
    with_ess = lambda curve, ess: (np.append(curve, ess), np.append(curve, ess))  # noqa: E731
    assert select_ess_or_shifted(*with_ess(top20, 0.0)) == (50.0, "fixed")  # ess-or-shifted: one step past the top
    assert select_ess_or_shifted(*with_ess(top20, 0.0), cap=SHIFT_CAP) == (20.0, "fixed")  # gain 1.2 pp: stays at 20
    small = top20.copy()
    small[-1] = top20[5] - SHIFT_CAP_GAIN + 0.01  # the top gains just under 0.5 pp on Base
    assert select_ess_or_shifted(*with_ess(small, 0.0), cap=SHIFT_CAP) == (50.0, "fixed")
    top10 = np.array([69.0, 69.5, 70.0, 71.0, 71.8, 71.5, 70.9, 70.8, 70.5, 70.4])  # smoothed top at 10: step to 20
    assert select_ess_or_shifted(*with_ess(top10, 0.0), cap=SHIFT_CAP) == (20.0, "fixed")
    top50 = np.array([69.0, 69.5, 70.0, 70.2, 70.6, 71.2, 71.6, 71.3, 70.5, 70.4])  # smoothed top at 50: step to 100
    assert select_ess_or_shifted(*with_ess(top50, 0.0), cap=SHIFT_CAP) == (100.0, "fixed")
    # ess 3 clears the margin over the uncapped pick's CV mean (50: 71.3) though not over the cap's (20: 71.6)
    assert select_ess_or_shifted(*with_ess(top20, 71.9), cap=SHIFT_CAP) == (ESS_TARGET, "ess")
    with pytest.raises(ValueError, match=r"cap=30\.0: must be a value of the grid"):
        select_ess_or_shifted(*with_ess(top20, 0.0), GRID, cap=30.0)


def test_bv_temperature_is_the_plug_in_of_the_fitted_clusters(tmp_path):
    """KMeansRouter(temperature="bv"): each query's weights are the formula at the plug-in 1/tau of its own cluster
    statistics (bias_variance_stats of n_i, V_i and the centroids), the same as tuning's "bv:c"; saved and loaded
    with nothing but the temperature; add_queries moves the statistics (larger clusters, smaller variance); Base
    ignores it; kNN and an infinite weight are refused by name; auto's rule "plug-in" resolves to it without a CV."""
    from proxray import KMeansRouter, KNNRouter
    from proxray.artifact import load_router
    from proxray.tuning import BV_WEIGHT, auto_choice, estimates_over
    from proxray.index import pairwise_distance
    from proxray.weights import bias_variance_inv_tau, bias_variance_stats, proximity_weights

    rng = np.random.default_rng(12)
    X = np.vstack([rng.normal(loc=m, size=(60, 8)) for m in (-2.0, 0.0, 2.0)])
    acc = (rng.uniform(size=(180, 3)) < np.repeat([[0.9, 0.3, 0.5], [0.2, 0.8, 0.5], [0.5, 0.5, 0.9]], 60, 0)) * 1.0
    cost = rng.uniform(size=(180, 3))
    r = KMeansRouter(n_clusters=9, inv_tau=BV_WEIGHT, temperature="bv").fit(X, acc, cost)
    var, l2 = r.bias_variance_stats()
    want_var, want_l2 = bias_variance_stats(r.acc_values_, r.sizes_,
                                            pairwise_distance(r.centers_, r.centers_, r.metric))
    np.testing.assert_allclose(var, want_var)
    assert l2 == pytest.approx(want_l2)
    assert l2 > 0  # three groups of different accuracy: proximity matters
    Q = rng.normal(size=(12, 8)) * 2.5
    phi, _, prior = r._search(Q)
    t = bias_variance_inv_tau(phi, prior, var, l2, BV_WEIGHT)
    assert len(np.unique(t)) > 1  # per query
    w = np.vstack([proximity_weights(phi[q:q + 1], t[q], prior) for q in range(len(Q))])
    np.testing.assert_allclose(r.estimate(Q)[0], w @ r.acc_values_)
    same = next(estimates_over(KMeansRouter(n_clusters=9).fit(X, acc, cost), Q, [f"bv:{BV_WEIGHT:g}"]))[0]
    np.testing.assert_allclose(r.estimate(Q)[0], same)
    r.save(tmp_path / "a")
    back = load_router(tmp_path / "a")
    assert (back.temperature, back.inv_tau_) == ("bv", BV_WEIGHT)
    np.testing.assert_allclose(back.estimate(Q)[0], r.estimate(Q)[0])
    grown = KMeansRouter(n_clusters=9, inv_tau=BV_WEIGHT, temperature="bv").fit(X, acc, cost)
    before = grown.estimate(Q)[0]  # the statistics are kept between calls until the clusters change
    assert grown.bias_variance_stats() is grown.bias_variance_stats()
    grown.add_queries(X, acc, cost)
    assert (grown.bias_variance_stats()[0] < var).all()  # twice the members: half the variance
    fresh = KMeansRouter(n_clusters=9, inv_tau=BV_WEIGHT, temperature="bv").fit(X, acc, cost).add_queries(X, acc, cost)
    np.testing.assert_array_equal(grown.estimate(Q)[0], fresh.estimate(Q)[0])
    assert not np.array_equal(grown.estimate(Q)[0], before)
    base = KMeansRouter(n_clusters=9, weighting="base", inv_tau=BV_WEIGHT, temperature="bv").fit(X, acc, cost)
    np.testing.assert_allclose(base.estimate(Q)[0], KMeansRouter(n_clusters=9, weighting="base").fit(X, acc, cost)
                               .estimate(Q)[0])
    with pytest.raises(ValueError, match="temperature='bv'.*router='knn' has none \\(KMeans routers only\\)"):
        KNNRouter(k=10, inv_tau=BV_WEIGHT, temperature="bv").fit(X, acc, cost)
    with pytest.raises(ValueError, match="inv_tau=inf with temperature='bv'.*finite number >= 0"):
        KMeansRouter(n_clusters=9, inv_tau=float("inf"), temperature="bv").fit(X, acc, cost)
    got = auto_choice(X, acc, cost, np.repeat(["a", "b", "c"], 60), "km", {"n_clusters": 9}, rule="plug-in")
    assert (got.inv_tau, got.temperature, got.rule, got.curves) == (BV_WEIGHT, "bv", "plug-in", {})
    with pytest.raises(ValueError, match="rule='plug-in' .* is measured for KMeans only"):
        auto_choice(X, acc, cost, np.repeat(["a", "b", "c"], 60), "knn", {"k": 10}, rule="plug-in")
