"""The gate a router version passes before it serves (proxray.monitor.gate, .candidates, .sources): leave-one-out
estimates against the formula, the shadow window's rule, the label sources' floor, a promoted version rolled back by
its live feedback, and a rollback under routed load that fails no request."""
import concurrent.futures as cf
import json
import time

import numpy as np
import pytest

from proxray import KMeansRouter, KNNRouter
from proxray.demos.drift import POOL, job_template
from proxray.monitor.config import GateSpec
from proxray.pool.simulated import make_table

TASK = "gsm8k"


@pytest.fixture(scope="module")
def world(tmp_path_factory, encoder):
    tmp = tmp_path_factory.mktemp("gate")
    full = make_table(20)
    X = encoder.encode(full.prompts)
    acc, cost = full.matrices(models=POOL)
    train = full.subset([q for q, t in zip(full.query_ids, full.tasks) if t != TASK])
    train.write(tmp / "train.parquet")
    full.write(tmp / "full.parquet")
    a, c = train.matrices(models=POOL)
    Xtr = encoder.encode(train.prompts)
    KNNRouter(k=20).fit(Xtr, a, c, models=POOL, encoder_id=encoder.id).save(tmp / "r0")
    return tmp, full, X, acc, cost, Xtr, a, c


def test_leave_one_out_estimates_are_the_routers_fitted_without_the_query(world):
    from proxray.monitor.gate import loo_estimate

    _, _, _, _, _, Xtr, a, c = world
    rows = np.array([0, 7, 33, 101])
    knn = KNNRouter(k=15).fit(Xtr, a, c, models=POOL)
    km = KMeansRouter(n_clusters=12, random_state=0).fit(Xtr, a, c, models=POOL)
    for router in (knn, km):
        got_a, got_c = loo_estimate(router, Xtr[rows], rows, a[rows], c[rows])
        for j, r in enumerate(rows):
            keep = np.arange(len(Xtr)) != r
            if router is knn:  # the same kNN on every other training query
                want = KNNRouter(k=15).fit(Xtr[keep], a[keep], c[keep], models=POOL).estimate(Xtr[r:r + 1])
            else:  # the same clusters, the query's own labels out of its cluster's mean
                own = router.labels_[r]
                n = router.sizes_[own]
                va = router.acc_values_.copy()
                vc = router.cost_values_.copy()
                va[own] = (va[own] * n - a[r]) / (n - 1)
                vc[own] = (vc[own] * n - c[r]) / (n - 1)
                w, _ = router.weights(Xtr[r:r + 1])
                want = (w @ va, w @ vc)
            assert np.allclose(got_a[j], want[0][0], atol=1e-6) and np.allclose(got_c[j], want[1][0], atol=1e-9)


def test_the_shadow_window_refuses_a_candidate_that_moves_the_served_routers_inliers(world, encoder):
    from proxray.monitor.candidates import Candidates
    from proxray.routing.registry import load_router

    tmp, full, X, acc, cost, Xtr, a, c = world
    served = load_router(tmp / "r0")
    spec = GateSpec(window_requests=40, window_s=1e9)
    threshold = float(np.quantile(served.training_outlier_scores(Xtr), 0.99))
    inl = X[np.flatnonzero(full.tasks != TASK)[::4][:40]]
    honest = load_router(tmp / "r0").add_queries(X[full.tasks == TASK], acc[full.tasks == TASK], cost[full.tasks == TASK])
    moved = KNNRouter(k=20).fit(Xtr, 1.0 - a, c, models=POOL)  # the same queries, every label inverted
    verdicts = {}
    for name, cand in (("honest", honest), ("moved", moved)):
        gate = Candidates(spec, 0.0, threshold)
        gate.open(1, "v1", cand, {}, {}, now=0.0)
        assert not gate.window_closed(1.0)
        started = time.perf_counter()
        for x in inl:
            gate.shadow(served, x)
        per_report_ms = 1e3 * (time.perf_counter() - started) / len(inl)
        assert gate.window_closed(1.0)
        verdicts[name] = gate.verdict()
        print(name, json.dumps(verdicts[name][2]), f"shadow cost {per_report_ms:.2f} ms a report, in the monitor")
    ok, why, figs = verdicts["honest"]
    assert ok and figs["requests"] == 40 and figs["inliers"] >= 35 and figs["inlier_agreement"] >= 0.8
    ok, why, figs = verdicts["moved"]
    assert not ok and "inliers" in why and figs["inlier_agreement"] < 0.5


def test_the_rule_rejects_what_is_worse_beyond_noise_not_a_batch_that_lost_one_query():
    """decide: Δ + 1.645·SE under −tolerance rejects. A 5-label batch with one query routed worse (Δ −0.2, SE 0.2) is
    noise and passes; the same Δ on every label (SE 0), 50 of 1,000 training queries routed worse, and a single query
    routed worse (no SE) are not."""
    from proxray.monitor.gate import compare, decide

    spec, ones = GateSpec(), np.ones(5)
    one_lost = compare(ones, np.array([0.0, 1, 1, 1, 1]))
    assert one_lost["delta"] == pytest.approx(-0.2) and one_lost["se"] == pytest.approx(0.2)
    ok, why = decide({"new": one_lost}, spec)
    assert ok and "SE 0.2000" in why
    ok, why = decide({"new": compare(ones, np.full(5, 0.8))}, spec)
    assert not ok and "the new labels worse held out" in why and "SE 0.0000" in why
    train = np.ones(1000)
    fifty = compare(train, np.r_[np.zeros(50), np.ones(950)])  # Δ −0.05, SE 0.0069: bound −0.039
    assert not decide({"train": fifty, "new": one_lost}, spec)[0]
    twenty = compare(train, np.r_[np.zeros(20), np.ones(980)])  # Δ −0.02: at the tolerance, not beyond it
    assert decide({"train": twenty, "new": one_lost}, spec)[0]
    single = compare(np.ones(1), np.zeros(1))
    assert single["se"] is None and not decide({"new": single}, spec)[0]
    assert decide({"train": twenty, "new": {"n": 0, "delta": None, "se": None}}, spec)[0]


def test_a_label_source_under_the_floor_is_set_aside_and_stays_aside():
    from proxray.monitor.sources import JUDGE, LabelSources

    src = LabelSources(GateSpec(), np.arange(3), np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]))
    assert [len(cells) for _, cells in src.canaries("e1")] and not src.trusted(JUDGE)
    assert src.check_feedback([("alice", 1.0, 1.0)]) == {}  # nothing checked while the judge is not trusted
    src.count(JUDGE, [True] * 27 + [False] * 3)
    assert src.trusted(JUDGE) and src.agreement(JUDGE) == pytest.approx(0.9)
    src.check_feedback([("alice", 1.0, 1.0), ("alice", 0.0, 0.0), ("mallory", 1.0, 0.0), ("mallory", 0.0, 1.0)])
    assert src.trusted("alice") and src.set_aside("mallory") and not src.trusted("mallory")
    src.count("mallory", [True] * 100)  # agreeing later does not bring a source back
    assert src.set_aside("mallory") and src.status()["mallory"]["agreement"] > 0.9


def test_a_promoted_version_whose_live_feedback_falls_is_rolled_back_by_itself(world, encoder, tmp_path):
    from proxray.monitor import DriftMonitor

    tmp, full, X, acc, cost, Xtr, a, c = world
    cfg = {"router": str(tmp / "r0"), "table": str(tmp / "train.parquet"), "state_dir": str(tmp_path / "state"),
           "job": job_template(table=tmp / "full.parquet"), "min_batch": 1000, "shadow_rate": 0.0, "submit": "inline",
           "feedback_batch": 1000, "feedback_max_wait_s": 1e9,
           "gate": {"window_requests": 5, "window_s": 1e9, "rollback_min_feedback": 10, "rollback_margin": 0.15,
                    "train_tolerance": 0.5, "min_inlier_agreement": 0.0}}  # about what follows a promotion
    mon = DriftMonitor(cfg, encoder=encoder)
    t_rows = np.flatnonzero(full.tasks == TASK)
    prompts = [full.prompts[i] for i in t_rows]
    for p in prompts[:12]:  # while version 0 serves: mostly right
        mon.feedback(p, POOL[1], 0.9)
    mon.sources.count("judge", [True] * 30)  # a judge already checked (the demo's tests check it through the pool)
    mon.absorber._offer_queries(X[t_rows], acc[t_rows], cost[t_rows], [f"k{i}" for i in t_rows], prompts,
                                ["drift"] * len(t_rows), None, {}, task="drift-1", absorbed="drift-1", n=len(t_rows))
    st = mon.status()
    assert st["gate"]["candidate"] and st["gate"]["candidate"]["version"] == 1, st["gate"]
    assert st["served_version"] == 0 and st["router_version"] == 1
    inl = X[np.flatnonzero(full.tasks != TASK)[:5]]
    for x, p in zip(inl, prompts):
        mon.report(p, x, 0.0)
    mon.tick()  # the window closed: promoted
    st = mon.status()
    assert st["served_version"] == 1 and st["gate"]["last_decision"]["decision"] == "promoted", st["gate"]
    assert len(mon.train_prompts) == len(full.prompts)  # its queries are the router's own now
    for p in prompts[:9]:  # fewer than rollback_min_feedback: nothing yet
        mon.feedback(p, POOL[1], 0.2)
    mon.tick()
    assert mon.status()["served_version"] == 1
    mon.feedback(prompts[9], POOL[1], 0.2)
    mon.tick()
    st = mon.status()
    assert st["served_version"] == 0 and mon.current_router() == str(tmp / "r0")
    (v1,) = [v for v in mon.versions() if v["version"] == 1]
    assert v1["status"] == "rolled_back" and "live feedback fell" in v1["rolled_back"]
    assert "proxray_monitor_served_version 0" in mon.prometheus()
    assert len(mon.train_prompts) == len(Xtr)


@pytest.mark.slow
def test_a_rollback_under_routed_load_fails_no_request(world, encoder, tmp_path, fresh_ray):
    """The monitor serves version 1 (grown from feedback); `rollback` while 6 clients route: every replica switches
    back between requests, and every request is answered."""
    import openai
    import ray
    from ray import serve

    from proxray.monitor import start_monitor, stop_monitor
    from proxray.serve.app import build_app
    from serve_helpers import free_port

    tmp, full, X, acc, cost, Xtr, a, c = world
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    name = "gate-rollback"
    cfg = {"name": name, "router": str(tmp / "r0"), "table": str(tmp / "train.parquet"),
           "state_dir": str(tmp_path / "state"), "job": job_template(table=tmp / "full.parquet"), "submit": "inline",
           "min_batch": 1000, "shadow_rate": 0.0, "feedback_batch": 4, "feedback_max_wait_s": 600.0, "tick_s": 0.5,
           "gate": {"enabled": False}}
    monitor = start_monitor(cfg)
    try:
        serve.run(build_app({"router": str(tmp / "r0"), "monitor": name, "reload_every_s": 0.3,
                             "models": [{"id": m, "engine": "sim"} for m in POOL]}), name="proxray", route_prefix="/")
        ray.get(monitor.start.remote())
        for i in np.flatnonzero(full.tasks == TASK)[:4]:
            ray.get(monitor.feedback.remote(full.prompts[i], POOL[1], 1.0, 1e-4, None, "ops"))
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30)

        def path():
            r = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": "hello"}])
            return r.model_extra["proxray"]["router_path"]

        v1 = None
        for _ in range(120):
            if path() != str(tmp / "r0"):
                v1 = path()
                break
            time.sleep(0.25)
        assert v1 and v1.endswith("v0001")
        results, stop = [], time.monotonic() + 60

        def client_loop(k):
            out = []
            while time.monotonic() < stop and not (out and out[-1][1] == str(tmp / "r0") and len(out) > 40):
                try:
                    r = client.chat.completions.create(
                        model="proxray", messages=[{"role": "user", "content": full.prompts[(k * 31 + len(out)) % 200]}])
                    out.append((200, r.model_extra["proxray"]["router_path"]))
                except openai.APIStatusError as e:
                    out.append((e.status_code, None))
            return out

        with cf.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(client_loop, k) for k in range(6)]
            time.sleep(2.0)
            moved = ray.get(monitor.rollback.remote())
            results = [r for f in futures for r in f.result()]
        print(json.dumps({"moved": moved, "requests": len(results),
                          "by_path": {p: sum(1 for _, q in results if q == p) for p in {q for _, q in results}}}))
        assert moved == {"from": 1, "to": 0, "path": str(tmp / "r0")}
        assert len(results) > 100 and all(s == 200 for s, _ in results)
        assert {q for _, q in results} == {v1, str(tmp / "r0")}  # served by both, switched between requests
    finally:
        serve.shutdown()
        stop_monitor(name)
