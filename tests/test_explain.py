"""The evidence behind a routing decision (proxray.routing.explain): the reference elements with the most weight,
named by the training queries' ids and tasks, the estimates and objectives the choice was made on, the margin, the
outlier score against the router's own threshold; saved with the artifact; `proxray explain` prints it."""
import json

import numpy as np
import pytest

from conftest import blobs
from proxray import KMeansRouter, KNNRouter
from proxray.routing.explain import evidence, format_evidence
from proxray.routing.objective import objective


def fitted(rng, cls, **kw):
    X, acc, cost, labels = blobs(rng, n_per=50, centers=4, models=3)
    ids, tasks = [f"q{i}" for i in range(len(X))], [f"task{c}" for c in labels]
    return cls(**kw).fit(X, acc, cost, models=["a", "b", "c"], query_ids=ids, tasks=tasks), X, labels


@pytest.mark.parametrize("lam", [0.0, 0.3])
def test_knn_evidence_is_the_weighted_vote(rng, lam):
    r, X, labels = fitted(rng, KNNRouter, k=15)
    x = X[7] + 0.01
    ev = evidence(r, x, lam, top=5)
    w, ref = r.weights(x[None])
    acc, cost = r.estimate(x[None])
    obj = objective(acc, cost, lam)[0]
    assert ev["kind"] == "neighbours" and ev["shown"] == 5 and ev["of"] == 15
    top = np.argsort(-w[0], kind="stable")[:5]
    assert [e["row"] for e in ev["elements"]] == list(ref[0][top])
    assert [e["weight"] for e in ev["elements"]] == pytest.approx(list(w[0][top]), abs=1e-6)
    assert all(e["query_id"] == f"q{e['row']}" and e["task"] == f"task{labels[e['row']]}" for e in ev["elements"])
    assert ev["weight_shown"] == pytest.approx(w[0][top].sum(), abs=1e-5)
    assert [m["model"] for m in ev["models"]] == [r.models_[i] for i in np.argsort(-obj, kind="stable")]
    assert ev["winner"] == r.models_[int(r.route(x[None], lam)[0])]
    assert ev["margin"] == pytest.approx(np.sort(obj)[-1] - np.sort(obj)[-2], abs=1e-6)
    assert ev["outlier_score"] == pytest.approx(float(r.outlier_score(x[None])[0]), abs=1e-6)
    assert ev["outlier"] is False  # a training query's near twin
    far = evidence(r, -X[7], lam)
    assert far["outlier"] is True and far["outlier_score"] > far["outlier_threshold"]
    json.dumps(ev)  # what the endpoint sends


def test_kmeans_evidence_names_clusters_with_their_tasks(rng):
    r, X, labels = fitted(rng, KMeansRouter, n_clusters=4)
    ev = evidence(r, X[60], 0.0, top=2)
    assert ev["kind"] == "clusters" and ev["shown"] == 2 and ev["of"] == 4
    best = ev["elements"][0]
    assert best["cluster"] == int(r.labels_[60]) and best["size"] == 50
    assert best["tasks"] == {f"task{labels[60]}": 50}  # one blob, one task
    assert best["spread"] == pytest.approx(r.spreads_[best["cluster"]], abs=1e-6)
    text = format_evidence(ev)
    assert f"routed to {ev['winner']}" in text and f"task{labels[60]} 50" in text
    with pytest.raises(ValueError, match="top=21: must be between 1 and 20"):
        evidence(r, X[0], top=21)


def test_the_artifact_keeps_what_the_evidence_names(rng, tmp_path):
    r, X, _ = fitted(rng, KNNRouter, k=10)
    r.add_queries(X[:3], np.ones((3, 3)), np.ones((3, 3)), query_ids=["new1", "new2", "new3"])
    r.save(tmp_path / "r")
    loaded = KNNRouter.load(tmp_path / "r")
    assert list(loaded.query_ids_[-3:]) == ["new1", "new2", "new3"] and list(loaded.tasks_[-3:]) == ["", "", ""]
    assert loaded.outlier_threshold_ == pytest.approx(r.outlier_threshold_)
    assert evidence(loaded, X[5]) == evidence(r, X[5])
    with pytest.raises(ValueError, match="query_ids has 2 entries for 200 training queries"):
        KNNRouter(k=5).fit(X, np.ones((200, 3)), query_ids=["a", "b"])


def test_a_scalar_is_saved_as_a_scalar_and_the_earlier_shape_still_loads(rng, tmp_path):
    """The outlier threshold is saved 0-d; artifacts written before held it as shape (1,), of which NumPy 2.4 refuses
    ``float()``: both load as the same number (the suite turns NumPy 2.3's warning about it into an error)."""
    import hashlib

    from proxray.routing.artifact import current_version

    r, _, _ = fitted(rng, KNNRouter, k=10)
    r.save(tmp_path / "r")
    version = current_version(tmp_path / "r")
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["files"]["outlier_threshold"]["shape"] == []
    np.save(version / "outlier_threshold.npy", np.asarray([r.outlier_threshold_]), allow_pickle=False)  # the old way
    manifest["files"]["outlier_threshold"].update(
        shape=[1], sha256=hashlib.sha256((version / "outlier_threshold.npy").read_bytes()).hexdigest())
    (version / "manifest.json").write_text(json.dumps(manifest))
    loaded = KNNRouter.load(tmp_path / "r")
    assert isinstance(loaded.outlier_threshold_, float) and loaded.outlier_threshold_ == r.outlier_threshold_
