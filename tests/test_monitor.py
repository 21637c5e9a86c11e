"""The drift monitor: calibration on the router's own outlier score, judge-labelled re-evaluation in
batches of min_batch within the budget, absorption, journal + snapshot restore, true J_z from shadow
evaluations, exactly-once submission, growth by a new pool model; and the production scenario (Serve +
the monitor started by its CLI + the Jobs API + a kill mid-evaluation) through ``proxray demo drift``."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from proxray import KNNRouter
from proxray.demos.drift import POOL, job_template
from proxray.monitor import DriftMonitor, text_key
from proxray.data.synthetic import generate_queries
from proxray.pool.simulated import make_table

import background

pytestmark = pytest.mark.slow
TASK = "gsm8k"

# ``proxray demo drift``'s run, in a process of its own with a Ray of its own: each of the three runs below starts in
# the background with a module whose tests leave a core idle much of their time and bound no latency, far enough ahead
# of the next quiet module that it seldom waits for the run (tests/background.py); each test asserts on its run's result
DEMOS = {"drift-judge-killed": dict(n_inliers=60, timeout_s=240, kill_mid_evaluation=True),
         "drift-feedback": dict(n_inliers=20, timeout_s=300, labels="feedback"),
         "drift-inverted-feedback": dict(n_inliers=20, timeout_s=300, labels="feedback", poison="inverted-feedback")}
BESIDE = {"drift-judge-killed": "tests/test_codex.py", "drift-feedback": "tests/test_endpoint_serve.py",
          "drift-inverted-feedback": "tests/test_response_cache.py"}
RUN = ("import json, sys; sys.path.insert(0, sys.argv[3]); import ray_ports; ray_ports.take_ray_ports_from_the_system(); "
       "from proxray.demos.drift import run; json.dump(run(**json.loads(sys.argv[1])), open(sys.argv[2], 'w'))")


def _demo(name):
    # timeout_s: a bound, the run returns once the gate decided
    def make(folder):
        kwargs = {"task": TASK, "n_per_task": 30, "min_batch": 10, "state_dir": str(folder / "state"), **DEMOS[name]}
        return ([[sys.executable, "-c", RUN, json.dumps(kwargs), folder / "result.json", Path(__file__).parent]],
                background.isolated_env(name), folder)
    return make


for _name in DEMOS:
    background.declare(_name, ["tests/test_monitor.py::test_drift_demo"], _demo(_name), seconds=60,
                       start_with=BESIDE[_name])


def demo_result(name) -> dict:
    done = background.result(name, timeout=900)  # a bound on a hang, not a timing
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return json.loads((done.folder / "result.json").read_text())


@pytest.fixture(scope="module")
def world(tmp_path_factory, encoder):
    tmp = tmp_path_factory.mktemp("drift")
    full = make_table(30)
    X = encoder.encode(full.prompts)
    acc, cost = full.matrices(models=POOL)
    train = full.subset([q for q, t in zip(full.query_ids, full.tasks) if t != TASK])
    train.write(tmp / "train.parquet")
    full.write(tmp / "full.parquet")  # what the simulated pool answers as it records
    a, c = train.matrices(models=POOL)
    Xtr = encoder.encode(train.prompts)
    KNNRouter(k=30).fit(Xtr, a, c, models=POOL, encoder_id=encoder.id).save(tmp / "r0")
    return tmp, full, X, acc, cost, Xtr


def config(tmp, state, **kw):
    return {"router": str(tmp / "r0"), "table": str(tmp / "train.parquet"), "state_dir": str(tmp / state),
            "job": job_template(table=tmp / "full.parquet"), "z": 3, "window": 200, "n_groups": 4, "min_batch": 10, "shadow_rate": 0.0,
            "shadow_batch": 10, "shadow_max_wait_s": 0.0, "min_group": 8, "submit": "inline",
            "gate": {"window_requests": 0}, **kw}


def send(mon, router, X, prompts):
    return [mon.report(p, x, float(s)) for p, x, s in zip(prompts, X, router.outlier_score(X))]


def traffic(world, encoder):
    tmp, full, X, acc, cost, Xtr = world
    new_q = generate_queries(6, seed=9)  # unseen queries of every training task
    inl = list(new_q[new_q.task != TASK].prompt)
    t_rows = np.flatnonzero(full.tasks == TASK)
    return inl, encoder.encode(inl), t_rows


# The in-process monitor's tests share one Ray (``local_ray``, the module's): each keeps its state in a folder of its own
# and submits its evaluations inline, so that nothing of one test lives in the Ray the next one uses (93 -> 70 s alone)
def test_detects_labels_with_the_judge_and_absorbs(world, encoder, local_ray):
    from proxray.routing.registry import load_router
    from proxray.experiments.metrics import routing_score
    from proxray.data.table import RoutingTable

    tmp, full, X, acc, cost, Xtr = world
    mon = DriftMonitor(config(tmp, "main"), encoder=encoder)
    router = load_router(tmp / "r0")
    # the threshold is the router's own outlier score on its training queries, left out of the reference
    assert mon.detector.threshold == pytest.approx(float(np.quantile(router.training_outlier_scores(Xtr), 0.99)))
    inl, Xi, t_rows = traffic(world, encoder)
    inlier_flags = send(mon, router, Xi, inl)
    assert np.mean(inlier_flags) <= 0.2
    t_flags = send(mon, router, X[t_rows], [full.prompts[i] for i in t_rows])
    assert np.mean(t_flags) >= 0.5 and np.mean(t_flags) > np.mean(inlier_flags) + 0.4
    # reports go to the journal, one line each; the snapshot is not rewritten per report
    assert not (tmp / "main" / "monitor_state.json").exists()
    assert len((tmp / "main" / "reports.jsonl").read_text().splitlines()) == len(inl) + len(t_rows)
    drifted = sum(inlier_flags) + sum(t_flags)
    again = DriftMonitor(config(tmp, "main"), encoder=encoder)  # a restart replays the journal
    st = again.status()
    assert st["reported"] == len(inl) + len(t_rows) and st["drifted"] == drifted and st["drift_queue"] == drifted
    again.tick()  # one evaluation of exactly min_batch queries, judge graded, absorbed
    st = again.status()
    assert st["router_version"] == 1 and st["drift_queue"] == drifted - 10
    (job,) = [j for j in st["jobs"] if j["kind"] == "drift"]
    assert job["status"] == "DONE" and job["n"] == 15  # 10 drifted + 5 canaries: 30 labels the judge grades again
    out = RoutingTable.read(next((tmp / "main" / "evaluations").glob("*drift*")) / "out" / "routing_table.parquet")
    assert set(out.df["grader"]) == {f"judge:{POOL[-1]}"} and out.n_queries == 15
    print(json.dumps(st["gate"]), json.dumps(st["label_sources"]))
    judge = st["label_sources"]["judge"]
    assert judge["checked"] == 30 and judge["agreement"] >= 0.75 and judge["trusted"]
    last = st["gate"]["last_decision"]
    assert last["decision"] == "promoted" and last["version"] == 1 and last["figures"]["new"]["n"] == 10
    assert last["figures"]["train"]["n"] > 100 and last["figures"]["new"]["delta"] > 0
    charged = float(out.df["cost"].sum() + out.df["judge_cost"].sum())
    assert st["spent_usd"] == pytest.approx(charged, rel=1e-6) and out.df["judge_cost"].sum() > 0
    assert load_router(st["router_path"]).n_train_ == router.n_train_ + 10
    # every later tick takes the next min_batch (a smaller rest waits for more traffic)
    for _ in range(3):
        again.tick()
    st = again.status()
    n_jobs = len([j for j in st["jobs"] if j["kind"] == "drift"])
    assert n_jobs == 1 + (drifted - 10) // 10 and st["drift_queue"] == drifted % 10 and st["router_version"] == n_jobs
    r1 = load_router(st["router_path"])
    assert r1.n_train_ == router.n_train_ + 10 * n_jobs
    rest = t_rows[~np.isin([text_key(full.prompts[i]) for i in t_rows], list(again.book.seen))]
    before = routing_score(*router.estimate(X[t_rows]), acc[t_rows], cost[t_rows])
    after = routing_score(*r1.estimate(X[t_rows]), acc[t_rows], cost[t_rows])
    print(f"AUC on {TASK}: {before:.2f} -> {after:.2f} after {n_jobs} judged evaluations ({len(rest)} never evaluated)")
    assert after > before + 2.0, (before, after)
    # every version kept; a rollback serves the one the served version replaced, then any by number
    versions = again.versions()
    assert [v["version"] for v in versions] == list(range(n_jobs + 1))
    assert [v["status"] for v in versions] == ["replaced"] * n_jobs + ["served"]
    assert all(v["why"]["n"] == 10 and v["n_train"] == router.n_train_ + 10 * v["version"] for v in versions[1:])
    moved = again.rollback()
    assert moved["from"] == n_jobs and moved["to"] == n_jobs - 1 and again.current_router() == versions[-2]["path"]
    assert len(again.train_prompts) == router.n_train_ + 10 * (n_jobs - 1)  # the served router's own
    assert again.status()["served_version"] == n_jobs - 1 and "proxray_monitor_served_version" in again.prometheus()
    with pytest.raises(ValueError, match="not a version"):
        again.rollback(to=99)
    again.rollback(to=0)
    assert [v["status"] for v in again.versions()] == ["served"] + ["replaced"] * (n_jobs - 2) + ["rolled_back"] * 2
    restarted = DriftMonitor(config(tmp, "main"), encoder=encoder)  # the served version survives a restart
    assert restarted.current_router() == str(tmp / "r0") and restarted.status()["served_version"] == 0
    assert len(restarted.train_prompts) == router.n_train_


def test_a_judge_grading_at_random_is_set_aside_and_nothing_more_is_spent_on_it(world, encoder, local_ray):
    """The judge's verdicts flipped at random (``judge_error: 0.5``): its first evaluation's canaries disagree with
    the training table, the candidate it labelled is refused, the judge is set aside, and the drifted queries that
    keep coming are asked of it no more."""
    from proxray.routing.registry import load_router

    tmp, full, X, acc, cost, Xtr = world
    mon = DriftMonitor(config(tmp, "random-judge", job=job_template(table=tmp / "full.parquet", judge_error=0.5),
                              gate={"window_requests": 0}), encoder=encoder)
    router = load_router(tmp / "r0")
    t_rows = np.flatnonzero(full.tasks == TASK)
    send(mon, router, X[t_rows], [full.prompts[i] for i in t_rows])
    for _ in range(3):
        mon.tick()
    st = mon.status()
    print(json.dumps(st["label_sources"]), json.dumps(st["gate"]["last_decision"]))
    judge = st["label_sources"]["judge"]
    assert judge["set_aside"] and not judge["trusted"] and judge["agreement"] < 0.75
    assert st["served_version"] == 0 and st["gate"]["decisions"]["promoted"] == 0
    assert len([j for j in st["jobs"] if j["kind"] == "drift"]) == 1 and st["drift_queue"] >= 10  # asked once only
    assert st["blocked"] == "judge set aside"


def test_shadow_overlap_separates_a_new_task_from_inliers(world, encoder, local_ray):
    from proxray.routing.registry import load_router

    tmp, full, X, acc, cost, Xtr = world
    mon = DriftMonitor(config(tmp, "shadow", shadow_rate=1.0, min_batch=1000, shadow_batch=100), encoder=encoder)
    router = load_router(tmp / "r0")
    inl, Xi, t_rows = traffic(world, encoder)
    send(mon, router, Xi, inl)
    t_prompts = [full.prompts[i] for i in t_rows]
    send(mon, router, X[t_rows], t_prompts)
    for _ in range(12):
        mon.tick()
        if not mon.book.shadow_queue:
            break
    mon.tick()  # the J_z trigger acts on the groups observed so far
    assert not mon.book.shadow_queue and len(mon.overlap.observed) == len(inl) + len(t_rows)
    j_in, j_new = mon.overlap_of(inl)["j"], mon.overlap_of(t_prompts)["j"]
    assert j_new < mon.overlap.threshold <= j_in, (j_new, mon.overlap.threshold, j_in)
    st = mon.status()
    assert st["overlap"]["outlier"]["j"] < mon.overlap.threshold
    # the J_z trigger queued the low-overlap group's recent traffic for re-evaluation
    trig = [e for e in st["events"] if e["event"] == "overlap_trigger"]
    assert trig and all(e["j"] < mon.overlap.threshold for e in trig)
    assert 'proxray_monitor_topz_overlap{traffic="outlier"}' in mon.prometheus()


def test_explain_and_the_monitor_agree_on_every_querys_outlier_flag(world, encoder):
    """One threshold: the one the router's artifact holds, which `proxray explain` shows and the monitor flags by."""
    from proxray.routing.explain import evidence
    from proxray.routing.registry import load_router

    tmp, full, X, acc, cost, Xtr = world
    mon = DriftMonitor(config(tmp, "agree"), encoder=encoder)
    router = load_router(tmp / "r0")
    assert mon.detector.threshold == router.outlier_threshold_
    inl, Xi, t_rows = traffic(world, encoder)
    prompts = inl + [full.prompts[i] for i in t_rows]
    Q = np.vstack([Xi, X[t_rows]])
    flags = send(mon, router, Q, prompts)
    explained = [evidence(router, q, 0.0)["outlier"] for q in Q]
    assert flags == explained and 0 < sum(flags) < len(flags)  # both kinds of query, the same verdict on each


def test_budget_caps_and_dedup(world, encoder):
    tmp, *_ = world
    mon = DriftMonitor(config(tmp, "budget", cost_budget=1e-9, max_buffer=5), encoder=encoder)
    x = np.ones(384, np.float32)
    for i in range(8):
        mon.report(f"prompt {i}", x, 10.0)
    mon.report("prompt 0", x, 10.0)  # the same text again
    st = mon.status()
    assert st["drift_queue"] == 5 and st["dropped_full"] == 3 and st["repeats"] == 1
    mon.config = mon.planner.cfg = mon.config.model_copy(update={"min_batch": 5})
    mon.tick()
    st = mon.status()
    assert st["blocked"] == "budget" and not st["jobs"] and st["spent_usd"] == 0  # over budget: nothing submitted


class FakeJobs:
    """A Jobs API stand-in: a registry of submitted ids shared by every runner (like the cluster's)."""
    submitted: dict = {}

    def __init__(self, down=False, status="RUNNING"):
        self.down, self.next_status, self.stopped = down, status, []

    def submit(self, sid, config_path, out, models=None):
        if self.down:
            raise ConnectionError("Jobs API unreachable")
        if sid in FakeJobs.submitted:
            return  # "already exists": the Jobs API refuses a second job with the id
        FakeJobs.submitted[sid] = 1

    def status(self, sid):
        return self.next_status if sid in FakeJobs.submitted else "MISSING"

    def stop(self, sid):
        self.stopped.append(sid)


def test_exactly_once_submission_and_failures(world, encoder):
    tmp, *_ = world
    FakeJobs.submitted = {}
    x = np.ones(384, np.float32)
    cfg = config(tmp, "once", submit="jobs_api", job_timeout_s=100.0, retry_after_s=50.0)
    mon = DriftMonitor(cfg, encoder=encoder, runner=FakeJobs(down=True))
    for i in range(10):
        mon.report(f"prompt {i}", x, 10.0)
    mon.tick(now=1000.0)  # recorded with its id, the submission failed (API down)
    (e,) = mon.evaluations.items
    assert e["status"] == "SUBMITTING" and not FakeJobs.submitted
    # a restarted monitor finds it and submits that id; a second restart does not submit again
    for _ in range(2):
        mon = DriftMonitor(cfg, encoder=encoder, runner=FakeJobs())
        mon.tick(now=1001.0)
    assert list(FakeJobs.submitted) == [e["id"]] and mon.evaluations.items[0]["status"] == "RUNNING"
    assert len(mon.evaluations.items) == 1
    # a job that outlives the timeout is stopped, failed, its queries queued again, retried after the wait
    mon.tick(now=mon.evaluations.items[0]["submitted"] + 101.0)
    assert mon.evaluations.items[0]["status"] == "FAILED" and mon.evaluations.runner.stopped == [e["id"]]
    assert mon.status()["drift_queue"] == 10 and mon.status()["spent_usd"] == pytest.approx(0.0, abs=1e-12)
    mon.tick(now=mon.not_before - 1)
    assert len(mon.evaluations.items) == 1
    mon.tick(now=mon.not_before + 1)
    assert len(mon.evaluations.items) == 2 and mon.evaluations.items[1]["id"] != e["id"]
    # a job the Jobs API forgot (its head restarted) is submitted again once, under a new id, to resume; forgotten
    # again, it is failed
    FakeJobs.submitted.clear()
    mon.tick(now=mon.not_before + 2)
    again = mon.evaluations.items[1]
    assert again["status"] == "RUNNING" and list(FakeJobs.submitted) == [f"{again['id']}-retry1"] == [again["job"]]
    FakeJobs.submitted.clear()
    mon.tick(now=mon.not_before + 3)
    assert mon.evaluations.items[1]["status"] == "FAILED" and "missing" in mon.evaluations.items[1]["error"]


def test_a_model_added_to_the_pool_is_added_to_the_router(world, encoder, local_ray):
    from proxray.routing.registry import load_router

    tmp, *_ = world
    new = "Qwen/Qwen2-7B-Instruct"
    job = job_template(POOL + [new])
    mon = DriftMonitor(config(tmp, "grow", job=job, cost_budget=10.0), encoder=encoder)
    mon.tick()
    st = mon.status()
    assert st["models"] == POOL + [new] and st["router_version"] == 1
    (g,) = [j for j in st["jobs"] if j["kind"] == "growth"]
    assert g["status"] == "DONE" and g["n"] == len(mon.train_prompts)
    r = load_router(st["router_path"])
    assert r.models_ == POOL + [new] and r.acc_values_.shape == (len(mon.train_prompts), len(POOL) + 1)
    mon.tick()
    assert len([j for j in mon.status()["jobs"] if j["kind"] == "growth"]) == 1  # done once


def test_drift_demo_end_to_end():
    """The operator's path: Serve with `monitor:` naming a monitor started later by `proxray monitor start
    --config`; inlier then new-task traffic through the openai client; the monitor detects, submits one
    judged job through the Jobs API, is killed while it runs, restarts, absorbs; the replicas switch."""
    res = demo_result("drift-judge-killed")
    print(json.dumps(res))
    assert res["driver"] == "monitor" and res["judge"] == POOL[-1] and res["served_before_monitor"]
    assert res["killed_mid_evaluation"] and len(res["drift_jobs"]) == 1  # not submitted twice
    assert res["evaluations"] >= 1 and res["served_router_switched"]
    assert res["after"] > res["before"] + 2.0
    assert res["detected_after_new_task_queries"] is not None and res["detected_after_new_task_queries"] <= 5
    assert res["overlap_new_task"] < res["overlap_threshold"] <= res["overlap_inlier"]
    # it passed the gate: held-out figures, the judge's canaries, a shadow window on the traffic that went on
    served = next(v for v in res["versions"] if v["status"] == "served")
    figures = served["gate"]["figures"]
    assert served["version"] >= 1 and figures["new"]["delta"] > 0 and figures["train"]["delta"] >= -0.02
    assert served["gate"]["shadow"]["requests"] >= 1 and res["label_sources"]["judge"]["trusted"]


def test_monitor_config_errors_name_the_field(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT
    from proxray.monitor import load_monitor_config

    shipped = load_monitor_config(ROOT / "monitor_configs" / "cpu_demo.yaml")
    assert shipped.table == "embedded" and shipped.job.grader.model == "meta-llama/Llama-3.3-70B-Instruct"
    bad = {"router": "r", "table": "t.parquet", "state_dir": "s", "shadow_rate": 1.5,
           "job": {"models": [{"id": "a", "engine": "sim", "price": {"input_per_mtok": 1, "output_per_mtok": 1}}]}}
    (tmp_path / "m.yaml").write_text(__import__("yaml").safe_dump(bad))
    r = subprocess.run([sys.executable, "-m", "proxray.cli", "monitor", "start", "--config", str(tmp_path / "m.yaml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "shadow_rate" in r.stderr and "job: Value error, grader: required" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_monitor_keeps_everything_on_an_object_store(world, encoder, local_ray, s3, tmp_path, monkeypatch):
    """router, table and state_dir as s3:// URIs (moto's S3 API on 127.0.0.1): reports are journal objects, one
    each; a restart replays them; an evaluation's queries, job config and output, and the grown router's new
    version, all land in the bucket; nothing is written to the working directory."""
    from proxray.data.table import RoutingTable
    from proxray.routing.registry import load_router

    tmp, full, X, acc, cost, Xtr = world
    uri, client, _ = s3
    base, _, query = uri.partition("?")

    def at(rel):
        return f"{base}/{rel}?{query}"

    RoutingTable.read(tmp / "train.parquet").write(at("train.parquet"))
    load_router(tmp / "r0").save(at("r0"))
    monkeypatch.chdir(tmp_path)
    cfg = {**config(tmp, "unused"), "router": at("r0"), "table": at("train.parquet"), "state_dir": at("state")}
    mon = DriftMonitor(cfg, encoder=encoder)
    router = load_router(at("r0"))
    rows = np.flatnonzero(full.tasks == TASK)[:12]
    flags = send(mon, router, X[rows], [full.prompts[i] for i in rows])
    journal = [o["Key"] for o in client.list_objects_v2(Bucket="runs", Prefix="job/state/journal/")["Contents"]]
    assert len(journal) == len(rows)  # one object per report: nothing to append to
    again = DriftMonitor(cfg, encoder=encoder)  # a restart replays them
    assert again.status()["drifted"] == sum(flags) >= 10
    again.tick()
    st = again.status()
    assert st["router_version"] == 1 and st["router_path"].startswith("s3://runs/job/state/routers/v0001")
    assert load_router(st["router_path"]).n_train_ == router.n_train_ + 10
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="runs", Prefix="job/state/")["Contents"]]
    assert any(k.endswith("/queries.jsonl") for k in keys) and any(k.endswith("/out/routing_table.parquet") for k in keys)
    # the snapshot holds them now (pyarrow leaves an empty folder marker, journal/, behind)
    assert not [k for k in keys if k.startswith("job/state/journal/") and not k.endswith("/")]
    assert list(tmp_path.iterdir()) == []


def test_feedback_alone_grows_the_router_and_joins_the_judges_labels(world, encoder, local_ray):
    """Users' scores as labels: on their own (the scored model's label from the user, the others the router's own
    estimate, grader feedback / router in the table), replayed from the journal after a restart; and beside the
    judge's labels when the scored query is in an evaluation (the user's score replaces the judge's)."""
    from proxray.routing.registry import load_router
    from proxray.data.table import RoutingTable

    tmp, full, X, acc, cost, Xtr = world
    router = load_router(tmp / "r0")
    t_rows = np.flatnonzero(full.tasks == TASK)[:12]
    prompts = [full.prompts[i] for i in t_rows]
    chosen = router.route(X[t_rows], lam=0.0)  # the model that answered each query
    cfg = config(tmp, "feedback", max_evals_per_hour=0, feedback_batch=10, feedback_max_wait_s=1e6)
    mon = DriftMonitor(cfg, encoder=encoder)
    for i, p in enumerate(prompts):
        mon.feedback(p, POOL[chosen[i]], float(acc[t_rows[i], chosen[i]]), float(cost[t_rows[i], chosen[i]]),
                     comment="right" if acc[t_rows[i], chosen[i]] > 0.5 else "wrong")
    mon.feedback(prompts[0], "no/such-model", 1.0)  # a model the router lacks: counted, not learned
    mon = DriftMonitor(cfg, encoder=encoder)  # a restart replays the feedback from the journal
    st = mon.status()["feedback"]
    assert st["received"] == 13 and st["pending"] == 12
    assert st["by_model"]["no/such-model"] == {"count": 1, "mean_score": 1.0}
    mon.tick()  # one batch of 10 on their own, spot-checked by the judge first; 2 wait for more (or feedback_max_wait_s)
    st = mon.status()
    assert st["router_version"] == 1 and st["feedback"]["pending"] == 2 and st["feedback"]["absorbed"] == 10
    # the judge graded 4 of the batch (and its canaries) before it could train: one small evaluation, no drift one
    assert st["feedback"]["unknown_model"] == 1 and [j["kind"] for j in st["jobs"]] == ["spot"]
    src = st["label_sources"]
    assert src["judge"]["trusted"] and src["anonymous"]["checked"] == 4 and src["anonymous"]["trusted"]
    assert st["gate"]["last_decision"]["decision"] == "promoted" and st["served_version"] == 1
    r1 = load_router(st["router_path"])
    assert r1.n_train_ == router.n_train_ + 10
    # the ids users' queries get in a grown router (what explain shows every user): keyed hashes, not the text's,
    # the same after a restart, another monitor's another
    keys = [text_key(p) for p in prompts]
    ids = mon.decisions.public_ids(keys)
    assert all(i.startswith("q-") for i in ids) and len(set(ids)) == len(keys) and not set(ids) & set(keys)
    assert DriftMonitor(cfg, encoder=encoder).decisions.public_ids(keys) == ids
    assert DriftMonitor(config(tmp, "elsewhere", max_evals_per_hour=0), encoder=encoder).decisions.public_ids(keys) != ids
    est_acc, est_cost = router.estimate(X[t_rows[:10]])
    for i in range(10):  # the scored model's label is the user's; every other model's the router's estimate
        row, m = r1.acc_values_[router.n_train_ + i], chosen[i]
        assert row[m] == acc[t_rows[i], m] and r1.cost_values_[router.n_train_ + i, m] == pytest.approx(cost[t_rows[i], m])
        others = np.arange(len(POOL)) != m
        assert np.allclose(row[others], est_acc[i, others]) and np.allclose(r1.cost_values_[router.n_train_ + i, others],
                                                                            est_cost[i, others])
    (table_dir,) = (tmp / "feedback" / "feedback").iterdir()
    df = RoutingTable.read(table_dir / "routing_table.parquet").df
    assert (df["grader"] == "feedback:anonymous").sum() == 10 and (df["grader"] == "router").sum() == 10 * (len(POOL) - 1)
    # beside the judge: a drifted query in an evaluation keeps the judge's labels but the user's score for its model
    cfg2 = config(tmp, "feedback-judged", min_batch=10, feedback_batch=10, feedback_max_wait_s=1e6)
    mon = DriftMonitor(cfg2, encoder=encoder)
    for p, x in zip(prompts[:10], X[t_rows[:10]]):
        mon.report(p, x, 10.0)  # far from every training query: drifted
    assert mon.status()["drift_queue"] == 10
    mon.feedback(prompts[3], POOL[0], 1.0, 0.0)
    mon.tick()  # the evaluation labels all 10; the scored query waited for it rather than going on its own
    st = mon.status()
    assert st["router_version"] == 1 and st["feedback"]["merged"] == 1 and st["feedback"]["absorbed"] == 0
    r = load_router(st["router_path"])
    (ev_dir,) = (tmp / "feedback-judged" / "evaluations").glob("*drift*")
    lab = RoutingTable.read(ev_dir / "out" / "labelled" / "routing_table.parquet").df
    assert list(lab.loc[lab["grader"] == "feedback:anonymous", "model"]) == [POOL[0]]
    assert (lab["grader"] == "judge").sum() == 59
    row = list(dict.fromkeys(lab["query_id"])).index(text_key(prompts[3]))  # the evaluation's order, as added
    assert r.acc_values_[router.n_train_ + row, 0] == 1.0


def test_drift_demo_grows_the_router_from_feedback_alone():
    """`proxray demo drift --labels feedback`: no judge, no evaluation job; the users who send the new task's queries
    score the answers through POST /v1/feedback, the monitor adds them round after round and the served router
    switches to each grown version."""
    res = demo_result("drift-feedback")
    print(json.dumps(res))
    # no drift evaluation; the judge only spot-checks a sample of each feedback batch (and its own canaries)
    assert res["labels"] == "feedback" and res["evaluations"] == 0 and res["drift_jobs"] == []
    assert set(res["evaluation_kinds"]) == {"spot"} and 0 < res["spent_usd"] < 0.02
    assert res["feedback_scored"] == 15 and res["feedback"]["absorbed"] == 15 and res["feedback"]["pending"] == 0
    assert res["label_sources"]["anonymous"]["trusted"] and res["label_sources"]["judge"]["trusted"]
    assert res["served_router_switched"] and res["served_version"] >= 1
    assert res["after"] > res["before"] + 10.0  # 56.3 -> 83.2 when measured


@pytest.mark.parametrize("poison", ["inverted-feedback"])  # a judge at random: in the monitor's own test above
def test_drift_demo_poisoned_labels_never_reach_the_served_version(poison):
    """`proxray demo drift --poison inverted-feedback`: the users' scores inverted (1 − s) — the served version stays
    the first, each candidate is kept rejected, and the status says why."""
    res = demo_result(f"drift-{poison}")
    print(json.dumps({k: res[k] for k in ("served_version", "label_sources", "gate", "versions", "spent_usd")}))
    source = "anonymous" if poison == "inverted-feedback" else "judge"
    assert res["served_version"] == 0 and not res["served_router_switched"] and res["after"] == res["before"]
    rejected = [v for v in res["versions"] if v["status"] == "rejected"]
    assert rejected and len(rejected) == len(res["versions"]) - 1 and res["gate"]["decisions"]["promoted"] == 0
    assert all("under the floor" in v["gate"]["why"] for v in rejected)
    src = res["label_sources"][source]
    assert src["set_aside"] and src["agreement"] < 0.75  # inverted: 0 of 6; at random: 15 of 30 when measured
    if poison == "random-judge":  # nothing more is spent on a judge set aside
        assert len(res["drift_jobs"]) == 1
