import numpy as np
import pytest

from conftest import blobs
from proxray import KNNRouter, LargestRouter, MLPRouter, RandomRouter, oracle_choice


def test_largest_and_random(rng):
    X, acc, cost, _ = blobs(rng)
    assert (LargestRouter().fit(X, acc, cost).route(X[:5]) == 2).all()
    assert (LargestRouter(model="m0").fit(X, acc, cost, models=["m0", "m1", "m2"]).route(X[:5]) == 0).all()
    r = RandomRouter(random_state=3).fit(X, acc, cost)
    np.testing.assert_array_equal(r.route(X), r.route(X))
    assert set(np.unique(r.route(X))) == {0, 1, 2}


def test_oracle_choice():
    acc = np.array([[1.0, 1.0], [0.0, 1.0]])
    cost = np.array([[2.0, 1.0], [1.0, 5.0]])
    np.testing.assert_array_equal(oracle_choice(acc, cost, 0.0), [1, 1])
    np.testing.assert_array_equal(oracle_choice(acc, cost, 1.0), [1, 0])


@pytest.mark.slow
def test_mlp_router_learns_cluster_skills(rng, tmp_path):
    X, acc, cost, labels = blobs(rng, n_per=150, centers=4, models=3)
    tr, te = np.arange(0, 600, 2), np.arange(1, 600, 2)
    mlp = MLPRouter(epochs=40, random_state=0).fit(X[tr], acc[tr], cost[tr])
    knn = KNNRouter(k=30).fit(X[tr], acc[tr], cost[tr])
    true_best = np.array([acc[labels == c].mean(0).argmax() for c in range(4)])[labels[te]]
    mlp_match = (mlp.route(X[te]) == true_best).mean()
    rand_match = (RandomRouter().fit(X, acc, cost).route(X[te]) == true_best).mean()
    assert mlp_match > 0.8 > rand_match
    assert abs(mlp_match - (knn.route(X[te]) == true_best).mean()) < 0.15
    _, c_hat = mlp.estimate(X[te])
    assert np.abs(c_hat.mean(0) - cost.mean(0)).max() < 0.2
    mlp.save(tmp_path / "mlp")
    again = MLPRouter.load(tmp_path / "mlp")
    np.testing.assert_allclose(again.estimate(X[te])[0], mlp.estimate(X[te])[0], atol=1e-6)
