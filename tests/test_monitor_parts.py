"""The drift monitor's parts on their own, without Ray, an encoder or a job: the traffic book, the J_z tracker, the
evaluations' bookkeeping and the checkpoint store."""
import numpy as np
import pandas as pd
import pytest

from proxray.experiments.metrics import jaccard, top_z
from proxray.monitor.detector import DriftDetector, group_name, text_key
from proxray.monitor.evaluations import Evaluations
from proxray.monitor.overlap import OverlapTracker
from proxray.monitor.state import state_store
from proxray.monitor.traffic import TrafficBook


def entry(seq, prompt, drifted=True, shadow=False, group=0):
    return {"seq": seq, "t": 100.0 + seq, "key": text_key(prompt), "prompt": prompt, "group": group,
            "drifted": drifted, "score": 1.0, "shadow": shadow}


def test_the_traffic_book_queues_each_drifted_text_once_within_its_bound():
    book = TrafficBook(window=3, max_buffer=2)
    for i, p in enumerate(["a", "b", "a", "c"], 1):
        book.apply(entry(i, p))
    assert list(book.drift_queue) == [text_key("a"), text_key("b")] and book.stats["repeats"] == 1
    assert book.stats["dropped_full"] == 1 and len(book.window) == 3 and book.seq == 4
    assert [e["event"] for e in book.events] == ["first_drift"]
    keys, items = book.take("drift", 1)
    assert keys == [text_key("a")] and items[0]["group"] == group_name(0, True) == "c0*"
    book.apply(entry(5, "a"))  # evaluated (or in flight): not queued again
    assert list(book.drift_queue) == [text_key("b")] and book.stats["repeats"] == 2
    book.give_back(keys, {keys[0]: {"prompt": "a", "group": "c0*", "reason": "retry"}})
    assert list(book.drift_queue) == [text_key("a"), text_key("b")] and keys[0] not in book.seen  # at the front
    again = TrafficBook(window=3, max_buffer=2)
    again.restore(book.state())
    assert again.state() == book.state()


def test_a_shadow_sample_and_a_j_z_trigger_queue_what_they_should():
    book = TrafficBook(window=10, max_buffer=10)
    book.apply(entry(1, "x", drifted=False, shadow=True, group=2))
    book.apply(entry(2, "y", drifted=False, shadow=False, group=2))
    assert list(book.shadow_queue) == [text_key("x")] and not book.drift_queue
    assert book.queue_group("c2") == 2 and book.drift_queue[text_key("y")]["reason"] == "overlap"
    assert book.queue_group("c2") == 0  # already queued


def test_j_z_is_the_mean_jaccard_of_a_groups_observed_top_z_with_each_training_tasks():
    rng = np.random.default_rng(0)
    acc, cost = rng.uniform(size=(60, 6)), rng.uniform(size=(60, 6)) * 1e-3
    tasks = np.repeat(["t1", "t2", "t3"], 20)
    tr = OverlapTracker(acc, cost, tasks, lam=100.0, z=2, min_group=3, threshold="auto", max_observed=5)
    u = acc - 100.0 * cost
    sets = {t: frozenset(top_z(u[tasks == t].mean(0), 2)) for t in ("t1", "t2", "t3")}
    assert {t: frozenset(s) for t, s in tr.task_sets.items()} == sets
    own = [np.mean([jaccard(s, o) for v, o in sets.items() if v != t]) for t, s in sets.items()]
    assert tr.threshold == pytest.approx(0.5 * np.mean(own))
    for i in range(4):
        tr.observe(f"k{i}", {"group": "c1*", "outlier": True}, acc[i], cost[i])
    want = np.mean([jaccard(frozenset(top_z(u[:4].mean(0), 2)), s) for s in sets.values()])
    assert tr.by_group() == {"c1*": {"j": round(want, 4), "n": 4}}
    assert tr.by_kind()["outlier"]["n"] == 4 and tr.by_kind()["inlier"] == {"j": None, "n": 0}
    tr.observe("k4", {"group": "c1*", "outlier": True}, acc[4], cost[4])
    tr.observe("k5", {"group": "c1*", "outlier": True}, acc[5], cost[5])
    assert list(tr.observed) == ["k1", "k2", "k3", "k4", "k5"]  # at most max_observed, oldest dropped
    tr.add_task("absorbed", acc[:4], cost[:4])
    assert "absorbed" in tr.task_sets and tr.of({"k1"})["n"] == 1


class Jobs:
    def __init__(self):
        self.states, self.stopped, self.submitted = {}, [], []

    def submit(self, sid, config_path, out, models=None):
        self.states.setdefault(sid, "RUNNING")
        self.submitted.append((sid, config_path, out))

    def status(self, sid):
        return self.states.get(sid, "MISSING")

    def stop(self, sid):
        self.stopped.append(sid)


def test_evaluations_are_recorded_before_submitting_and_charged_what_they_cost(tmp_path):
    from proxray.evaljob.config import JobTemplate

    template = JobTemplate.model_validate({"models": [{"id": "a", "engine": "sim", "price": {"input_per_mtok": 1.0,
                                                                                           "output_per_mtok": 2.0}}]})
    checkpoints, jobs = [], Jobs()
    ev = Evaluations("m", tmp_path, jobs, budget=1.0, est_cost=0.01, checkpoint=lambda: checkpoints.append(1))
    rows = [{"query_id": f"q{i}", "task": "c0*", "prompt": f"p{i}"} for i in range(3)]
    e = ev.record("drift", rows, {r["query_id"]: {"group": "c0*", "outlier": True} for r in rows}, 0.03, 10.0,
                  template)
    assert e["status"] == "RUNNING" and len(checkpoints) == 2 and ev.spent == pytest.approx(0.03)
    assert e["id"].startswith("m-drift-0001-") and ev.prompts(e) == {"q0": "p0", "q1": "p1", "q2": "p2"}
    assert ev.running("drift") and ev.started_within("drift", 100.0, 3600) == 1 and not ev.affordable(0.98)
    ev.charge(e, pd.DataFrame({"cost": [0.001, 0.002, None], "judge_cost": [0.001, 0.0, 0.0]}))
    assert e["charged"] == pytest.approx(0.004) and ev.spent == pytest.approx(0.004)
    assert ev.est_cost == pytest.approx(0.5 * 0.01 + 0.5 * 0.004 / 3)  # learnt from what jobs really cost
    jobs.states[e["id"]] = "FAILED"  # a node lost under it, its driver gone: submitted again once, to resume
    assert list(ev.outcomes(20.0, 100.0)) == [] and e["job"] == f"{e['id']}-retry1" and e["status"] == "RUNNING"
    assert e["config"] and jobs.submitted[-1] == (e["job"], e["config"], e["out"])  # same config, same output
    jobs.states[e["job"]] = "FAILED"
    assert list(ev.outcomes(20.0, 100.0)) == [(e, "job failed")]
    late = ev.record("shadow", rows[:1], {"q0": {"group": "c0", "outlier": False}}, 0.01, 10.0, template)
    assert list(ev.outcomes(111.0, 100.0))[-1] == (late, "timed out after 100 s") and jobs.stopped == [late["id"]]
    ev.fail(late, "timed out")  # nothing readable: nothing charged, the reservation released
    assert late["status"] == "FAILED" and late["charged"] == 0.0 and ev.spent == pytest.approx(0.004)
    assert ev.failed_within("shadow", 50.0, 100.0)


def test_the_state_store_replays_only_reports_after_its_snapshot(tmp_path):
    store = state_store(tmp_path)
    store.append({"seq": 1, "x": 1})
    store.snapshot({"seq": 1, "n": 1})
    store.append({"seq": 2, "x": 2})
    with (tmp_path / "reports.jsonl").open("a") as f:
        f.write('{"seq": 3, "x"')  # a line cut by a crash
    snap, entries = state_store(tmp_path).load()
    assert snap == {"seq": 1, "n": 1} and entries == [{"seq": 2, "x": 2}]


def test_the_detector_groups_by_nearest_cluster_and_flags_by_the_routers_own_threshold():
    class Router:
        outlier_threshold_ = None  # an artifact saved before it kept one: the same rule, computed here

        def training_outlier_scores(self, X):
            return np.linspace(0.0, 1.0, len(X))

    rng = np.random.default_rng(1)
    X = np.vstack([rng.normal(loc=c, scale=0.01, size=(20, 4)) for c in (np.eye(4)[0], np.eye(4)[1])])
    router = Router()
    d = DriftDetector(router, X, n_groups=2)
    assert d.threshold == pytest.approx(np.quantile(np.linspace(0, 1, 40), 0.99)) == router.outlier_threshold_
    assert d.group(X[0]) != d.group(X[-1]) and d.group(X[0]) == d.group(X[5])
    assert d.drifted(0.995) and not d.drifted(0.5)
    router.outlier_threshold_ = 0.42  # the artifact's: the one explain shows
    assert DriftDetector(router, X, n_groups=2).threshold == 0.42


def test_the_gate_decisions_reach_rays_metrics_as_a_counter_that_counts_each_decision_once(monkeypatch):
    """The monitor application sets its series from the monitor's status on every health check: the gate's decisions
    a counter, as the monitor's own text has them, counting on by what each status adds (and from where a monitor
    that started again stands)."""
    import proxray.common.metric_defs as defs
    from proxray.monitor.views import GateGauges

    calls = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def inc(self, value, tags=None):
            assert value > 0  # what Ray's Counter takes
            calls.append((self.name, value, tags))

        def set(self, value, tags=None):
            pass

    assert defs.METRICS["proxray_monitor_gate_decisions"].kind == "counter"
    monkeypatch.setattr(defs, "metric", Recorder)
    gauges = GateGauges()
    status = lambda **d: {"served_version": 0, "gate": {"decisions": d}, "label_sources": {}}  # noqa: E731
    for seen in ({"promoted": 0, "rejected": 0}, {"promoted": 0, "rejected": 0}, {"promoted": 2, "rejected": 1},
                 {"promoted": 2, "rejected": 1}, {"promoted": 1, "rejected": 1}, {"promoted": 2, "rejected": 1}):
        gauges.set(status(**seen))
    got = [(v, t["decision"]) for n, v, t in calls if n == "proxray_monitor_gate_decisions"]
    assert got == [(2, "promoted"), (1, "rejected"), (1, "promoted")]
