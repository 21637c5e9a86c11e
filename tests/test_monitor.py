"""The drift monitor: detection on the training set's own threshold, re-evaluation through the
evaluation job, incremental absorption, checkpoint/restore; and the end-to-end scenario."""
import json

import numpy as np
import pytest

from proxray import KNNRouter
from proxray.drift_demo import POOL, PRICES, Labeler
from proxray.monitor import DriftMonitor
from proxray.synthetic import generate_queries, make_table

pytestmark = pytest.mark.slow
TASK = "gsm8k"


@pytest.fixture(scope="module")
def world(tmp_path_factory, encoder):
    tmp = tmp_path_factory.mktemp("drift")
    full = make_table(30)
    X = encoder.encode(full.prompts)
    acc, cost = full.matrices(models=POOL)
    train = np.flatnonzero(full.tasks != TASK)
    full.subset([full.query_ids[i] for i in train]).write(tmp / "train.parquet")
    KNNRouter(k=30).fit(X[train], acc[train], cost[train], models=POOL, encoder_id=encoder.id).save(tmp / "r0")
    return tmp, full, X, acc, cost


def make_monitor(tmp, encoder, state="state", **kw):
    job = {"sampling": {"max_tokens": 32},
           "models": [{"id": m, "engine": "sim", "price_in": PRICES[m][1], "price_out": PRICES[m][2],
                       "num_cpus": 0.25, "batch_size": 16} for m in POOL]}
    return DriftMonitor(tmp / "r0", tmp / "train.parquet", tmp / state, z=3, window=60, min_batch=10,
                        job_config=job, labeler=Labeler(generate_queries(30)), submit="inline", encoder=encoder, **kw)


def test_monitor_detects_absorbs_and_restores(world, encoder):
    import ray

    from proxray.artifact import load_router
    from proxray.metrics import routing_score

    tmp, full, X, acc, cost = world
    mon = make_monitor(tmp, encoder)
    router = load_router(tmp / "r0")
    new_q = generate_queries(6, seed=9)  # unseen queries of every task
    inl = new_q[new_q.task != TASK]
    Xi = encoder.encode(list(inl.prompt))
    t_rows = np.flatnonzero(full.tasks == TASK)
    Xt = X[t_rows]

    def send(Xs, prompts):
        a, c = router.estimate(Xs)
        return [mon.report(f"q{i}", p, x, u, int(np.argmax(u)), float(s))
                for i, (p, x, u, s) in enumerate(zip(prompts, Xs, a, router.outlier_score(Xs)))]

    inlier_flags = send(Xi, list(inl.prompt))
    j_inliers = mon.overlap(min_group=3)
    assert np.mean(inlier_flags) <= 0.2
    t_flags = send(Xt, [full.prompts[i] for i in t_rows])
    # gsm8k is far from what the router saw (some of it is near svamp, also arithmetic)
    assert np.mean(t_flags) >= 0.5 and np.mean(t_flags) > np.mean(inlier_flags) + 0.4
    st = mon.status()
    assert st["buffer"] >= 15 and st["drifted"] == sum(inlier_flags) + sum(t_flags)
    assert j_inliers is not None and st["overlap"] is not None
    assert "proxray_monitor_drifted_total" in mon.prometheus()
    # restart: the same state comes back from the checkpoint
    again = make_monitor(tmp, encoder)
    assert again.status()["buffer"] == st["buffer"] and again.status()["reported"] == st["reported"]
    # re-evaluation through the evaluation job (inline here), then absorption
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        job = again.maybe_evaluate()
        assert job is not None and again.maybe_evaluate() is None  # one evaluation at a time
        new_path = again.poll()
    finally:
        ray.shutdown()
    assert new_path and again.status()["router_version"] == 1
    r1 = load_router(new_path)
    assert r1.n_train_ > router.n_train_
    before = routing_score(*router.estimate(Xt), acc[t_rows], cost[t_rows])
    after = routing_score(*r1.estimate(Xt), acc[t_rows], cost[t_rows])
    assert after > before + 2.0


def test_overlap_threshold_flags_whole_groups(world, encoder):
    from proxray.artifact import load_router

    tmp, full, X, acc, cost = world
    mon = make_monitor(tmp, encoder, state="overlap", overlap_threshold=1.01, min_group=3)  # any overlap < 1.01
    router = load_router(tmp / "r0")
    inl = np.flatnonzero(full.tasks == "sciq")[:8]
    a, c, o = router.estimate_with_outlier_score(X[inl])
    flags = [mon.report(f"s{i}", full.prompts[j], X[j], a[i], int(np.argmax(a[i])), 0.0) for i, j in enumerate(inl)]
    assert flags[:2] == [False, False] and any(flags[2:])  # flagged once its group has min_group queries


def test_budget_and_rate_limits(world, encoder):
    tmp, *_ = world
    mon = make_monitor(tmp, encoder, state="budget", cost_budget=0.0)
    mon.buffer = [{"query_id": f"x{i}", "prompt": "p"} for i in range(50)]
    assert mon.maybe_evaluate() is None  # over budget: nothing submitted
    mon2 = make_monitor(tmp, encoder, state="rate", max_evals_per_hour=0)
    mon2.buffer = mon.buffer
    assert mon2.maybe_evaluate() is None


def test_drift_demo_end_to_end(tmp_path):
    from proxray.drift_demo import run

    res = run(task=TASK, n_per_task=30, min_batch=10, state_dir=tmp_path, timeout_s=180)
    print(json.dumps(res))
    assert res["evaluations"] >= 1 and res["served_router_switched"]
    assert res["after"] > res["before"] + 2.0
