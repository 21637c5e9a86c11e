"""bench/tau_selection.py's readings of saved runs: losing configurations, the per table x protocol comparison with
the best fixed 1/tau, the noise estimate and --recheck's choice of configurations (crafted runs, no encoding)."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tau"))
import tau_selection as ts  # noqa: E402

G, N = len(ts.GRID), len(ts.SETTINGS)
AT = {g: ts.GRID.index(g) for g in (10.0, 20.0, float("inf"))}


def seed(out_delta, overall, base=70.0):
    """A seed whose CV curves peak at 1/tau = 10 (so KMeans' auto, shifted one step toward Base, picks 20; ess 3 is
    far below) and whose test scores are ``base`` except: the outlier split ``out_delta`` above Base at 20, and the
    overall split per {grid value: delta}."""
    cv = np.full(N, 50.0)
    cv[AT[10.0] - 1: AT[10.0] + 2] = (55.0, 60.0, 55.0)
    test = {k: np.full(N, base) for k in ts.SPLITS}
    test["outlier"][AT[20.0]] += out_delta
    for g, d in overall.items():
        test["overall"][AT[g]] += d
    return {"out_cv": cv.tolist(), "in_cv": cv.tolist(), "test": {k: v.tolist() for k, v in test.items()}}


def row(table, protocol, outliers, seeds):
    return {"table": table, "router": "km", "protocol": protocol, "outliers": outliers, "seeds": seeds}


@pytest.fixture()
def rows():
    return [
        # loses outlier AUC under auto (mean -1.0 pp over its seeds); overall +0.5 at 20, +1.0 at 10
        row("t1", "leave-task-out", ["a"], [seed(d, {20.0: 0.5, 10.0: 1.0}) for d in (-1.0, -0.5, -1.5)]),
        row("t1", "leave-task-out", ["b"], [seed(2.0, {20.0: 0.5, 10.0: 0.2}) for _ in range(3)]),
        row("t2", "few-shot-outlier", ["c"], [seed(0.0, {20.0: 0.1}) for _ in range(3)]),
    ]


def test_auto_picks_shifted_and_finds_the_loser(rows, tmp_path):
    pick = dict(ts.pickers(rows))[ts.AUTO["km"]]
    assert {pick(s) for r in rows for s in r["seeds"]} == {AT[20.0]}
    e = ts.effect(rows, pick)
    np.testing.assert_allclose(e["outlier"], [-1.0, 2.0, 0.0])
    assert (e["lose_out"], e["lose_in"]) == (1, 0)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"rows": rows}))
    assert ts.losers([path]) == [("t1", "km", "leave-task-out", ["a"])]


def test_by_group_against_the_best_fixed_inv_tau(rows):
    lines = ts.by_group(rows, resamples=200).splitlines()
    t1 = next(line for line in lines if line.startswith("| t1, leave-task-out (2)"))
    # auto +0.50; best fixed 10: (1.0 + 0.2) / 2 = +0.60; chosen on the other configuration: 20 for the first
    # (scored +0.5 there), 10 for the second (+0.2): +0.35
    assert "| +0.50 | 10: +0.60 | -0.10 [" in t1 and t1.endswith("| +0.35 |")
    t2 = next(line for line in lines if line.startswith("| t2, few-shot-outlier (1)"))
    assert "| +0.10 | 20: +0.10 | +0.00 [+0.00, +0.00] | — |" in t2


def test_plot_groups_writes_a_figure(rows, tmp_path):
    path = tmp_path / "groups.png"
    ts.plot_groups(rows, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ts.group_stats(rows, resamples=50)[1]["loo"] is None  # a group of one has no leave-one-out choice


def test_noise_counts_losers_and_their_expectation(rows):
    text = ts.noise(rows)
    # outlier: standard errors 0.29 (the loser), 0, 0 -> median 0; the loser's group mean is +0.5, so it was unlikely
    assert "outlier: median standard error of a configuration's mean 0.00 pp, losing configurations 1 observed, " \
           "0.0 expected" in text
    assert "inlier: median standard error of a configuration's mean 0.00 pp, losing configurations 0 observed" in text


def test_recheck_refuses_runs_without_the_auto_rule(tmp_path, rows):
    for r in rows:
        for s in r["seeds"]:
            del s["out_cv"], s["in_cv"]  # a --no-cv run: auto cannot be read back
    path = tmp_path / "nocv.json"
    path.write_text(json.dumps({"rows": rows}))
    with pytest.raises(SystemExit, match="auto rule"):
        ts.losers([path])


def test_from_json_prints_the_group_table(rows, tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"rows": rows}))
    ts.main(["--from-json", str(path), "--per-config"])
    out = capsys.readouterr().out
    assert "km, by table and protocol:" in out and "| t1 | leave-task-out | a | 3 | -1.00 |" in out
    with pytest.raises(SystemExit):
        ts.main(["--seeds", "1,x"])


def test_a_run_is_saved_before_its_report(rows, tmp_path, monkeypatch):
    """--json is written (atomically) before the report is printed: a report that fails loses no run."""
    class Table:
        prompts = ["q"]

        def matrices(self):
            return np.zeros((1, 1)), np.zeros((1, 1))

    monkeypatch.setattr(ts, "SentenceEncoder", lambda progress: type("E", (), {"encode": lambda self, p: p})())
    monkeypatch.setattr(ts.RoutingTable, "read", staticmethod(lambda path: Table()))
    monkeypatch.setattr(ts, "run_config", lambda *a, **k: rows[0]["seeds"][0])

    def report(*_):
        raise RuntimeError("the report failed")

    monkeypatch.setattr(ts, "report", report)
    path = tmp_path / "out" / "run.json"
    with pytest.raises(RuntimeError, match="the report failed"):
        ts.main(["--configs", "fresh11", "--routers", "km", "--seeds", "1,2", "--no-cv", "--json", str(path)])
    saved = json.loads(path.read_text())
    assert saved["seeds"] == [1, 2] and len(saved["rows"]) == sum(c[1] == "km" for c in ts.SETS["fresh11"])
    assert saved["rows"][0]["seeds"] == [rows[0]["seeds"][0]] * 2
    assert [p.name for p in path.parent.iterdir()] == ["run.json"]  # no temporary file left


def test_runs_without_cv_curves_pool_with_runs_that_have_them(rows, tmp_path, capsys):
    """fresh11 was run with --no-cv: kNN's auto (the fixed setting spr:0.2) is still read and compared per group,
    pooled with runs that hold CV curves; the CV rules are left out of a pool where any configuration lacks them;
    KMeans' auto (a CV rule) is not, and --plot-groups draws only the router whose auto it can read."""
    spr = ts.SETTINGS.index("spr:0.2")
    knn = [{**r, "router": "knn", "seeds": [{**s, "test": {k: list(v[:N - len(ts.BV)]) for k, v in s["test"].items()}}
                                             for s in r["seeds"]]} for r in rows]
    for r in knn:
        for s in r["seeds"]:
            s["test"]["overall"][spr] = s["test"]["overall"][ts.GRID.index(0.0)] + 0.4  # Base is 1/tau = 0 for kNN
    bare = [{**r, "outliers": [o + "2" for o in r["outliers"]], "seeds": [{"test": s["test"]} for s in r["seeds"]]}
            for r in knn]
    assert all(name.startswith("fixed ") for name, _ in ts.pickers(knn + bare))  # no CV rule
    assert any(not name.startswith("fixed ") for name, _ in ts.pickers(knn))
    assert ts._auto_pick(bare) is not None and ts._auto_pick([{**rows[0], "seeds": bare[0]["seeds"]}]) is None
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"rows": knn + bare + [{**rows[0], "seeds": bare[0]["seeds"]}]}))
    ts.main(["--from-json", str(path), "--plot-groups", str(tmp_path / "g.png")])
    out = capsys.readouterr().out
    assert "knn, by table and protocol:" in out and "km, by table and protocol:" not in out
    assert "| t2, few-shot-outlier (2) | +0.40 |" in out
    from PIL import Image

    assert Image.open(tmp_path / "g.png").size[0] < 1300  # one panel (kNN's), 7 inches at 130 dpi


# bench/km_task_local.py: KMeans' temperature per cluster from the CV folds of the tasks the cluster is made of
import km_task_local as tl  # noqa: E402

S = G + 1  # its curves: the grid, then ess:3


def folds(per_task: dict, repeats: int = 2):
    """Saved folds (``folds_cv``): each task held out once per repeat, its outlier curve over SETTINGS."""
    out, groups = [], []
    for r in range(repeats):
        for t, v in per_task.items():
            curve = np.zeros(N)
            curve[tl._GRID_ESS] = np.asarray(v) + r  # the repeats differ by 1: their mean is v + 0.5
            out.append(curve.tolist())
            groups.append([t])
    return {"out": out, "in": out, "groups": groups}


def test_task_curves_average_each_tasks_repeats_and_refuse_grouped_folds():
    tasks, curves = tl.task_curves(folds({"b": np.arange(S), "a": np.ones(S)}))
    assert tasks == ["a", "b"]
    np.testing.assert_allclose(curves, [np.full(S, 1.5), np.arange(S) + 0.5])
    grouped = folds({"a": np.ones(S)})
    grouped["groups"] = [["a", "b"]] * 2
    with pytest.raises(ValueError, match="several tasks together"):
        tl.task_curves(grouped)


def test_cluster_curves_weigh_tasks_by_their_share_of_the_cluster():
    # cluster 0: 4 queries of a; cluster 1: 1 of a, 3 of b; cluster 2: only c, a task too small to be held out
    labels = [0, 0, 0, 0, 1, 1, 1, 1, 2]
    train_tasks = ["a"] * 5 + ["b"] * 3 + ["c"]
    out_t, out_all = np.array([np.full(S, 4.0), np.zeros(S)]), np.full(S, -1.0)
    got = tl.cluster_curves(labels, train_tasks, ["a", "b"], out_t, out_all, n_clusters=3)
    np.testing.assert_allclose(got[:, 0], [4.0, 1.0, -1.0])  # 1 / 4 of a's 4.0 in cluster 1; c: the whole CV
    # shrunk toward the whole CV: a (5 queries) with n0 = 5 -> (4 - 1) / 2, b (3) -> 3 * 0 / 8 - 5 / 8
    shrunk = tl.cluster_curves(labels, train_tasks, ["a", "b"], out_t, out_all, n_clusters=3, n0=5)
    np.testing.assert_allclose(shrunk[:, 0], [1.5, 0.25 * 1.5 + 0.75 * -0.625, -1.0])


def test_cluster_picks_move_only_where_the_clusters_tasks_say_so():
    at20, base = ts.GRID.index(20.0), tl.BASE
    flat = np.zeros(S)
    prefers_base = np.zeros(S)
    prefers_base[base] = 1.0  # this cluster's tasks score Base 1 pp above every tilt
    curves, in_all = np.stack([flat, prefers_base]), np.zeros(S)
    np.testing.assert_array_equal(tl.cluster_picks("auto", curves, in_all, at20, None), [at20, at20])
    np.testing.assert_array_equal(tl.cluster_picks("to-base", curves, in_all, at20, None), [at20, base])
    np.testing.assert_array_equal(tl.cluster_picks("to-base", curves, in_all, at20, 50.0), [at20, at20])  # 20 < 50
    np.testing.assert_array_equal(tl.cluster_picks("to-base", curves, in_all, G, None), [G, G])  # ess: kept
    # "sharpen" takes the cluster's own pick only toward Base: a cluster preferring 1/tau = 2 keeps auto's 20
    prefers_2 = np.zeros(S)
    prefers_2[ts.GRID.index(2.0) - 1: ts.GRID.index(2.0) + 2] = 5.0
    got = tl.cluster_picks("sharpen", np.stack([prefers_2, prefers_base]), in_all, at20, None)
    assert got[0] == at20 and got[1] > at20


def test_km_plugin_reads_the_bv_scores_a_run_holds_and_refits_older_runs(rows):
    """bench/km_plugin.py: a run saved with tau_selection's BV settings is read as it is (the candidate's Prox − Base
    per split, auto beside it from the saved CV) and judged by the pre-registered conditions; a run saved before
    them (fewer settings) is refitted, and its fixed rows in tau_selection stop at the settings it holds."""
    import km_plugin as kp

    first = kp.CANDIDATES[0]
    at = N - len(ts.BV) + ts.BV.index(f"bv:{first:g}")
    for r in rows:
        for s in r["seeds"]:
            s["test"]["overall"][at] += 0.7
    never = lambda name: pytest.fail("refitted a run that holds its bv scores")  # noqa: E731
    got = [kp.config_result(r, [42, 7, 99], never) for r in rows]
    cand = kp._name(first)
    assert [g["delta"]["overall"][cand] for g in got] == pytest.approx([0.7, 0.7, 0.7])
    assert [g["delta"]["overall"][kp.AUTO] for g in got] == pytest.approx([0.5, 0.5, 0.1])  # auto picks 20
    table = kp.report(got)
    assert f"| {cand} | +0.00 | +0.00 | +0.700 | 0/0 | +0.700 | +0.700 |" in table
    # the pre-registered conditions: the first candidate scores differently, loses nothing, gains 0.333 pp on average
    verdict = kp.verdict(got).splitlines()
    assert verdict[0] == (f"c = {first:g}: mean +0.700 vs +0.367, losers 0/0 vs 1/0; conditions 1 met, 2 met, 3 met, "
                          "4 met") and verdict[-1] == f"adopted: c = {first:g}"
    assert "1 met, 2 met, 3 FAILED, 4 met" in verdict[1]  # the second scores +0 everywhere: 0.37 pp below auto
    old = [{**r, "seeds": [{**s, "test": {k: v[:N - len(ts.BV)] for k, v in s["test"].items()}} for s in r["seeds"]]}
           for r in rows]
    assert not any(name.startswith("fixed bv:") for name, _ in ts.pickers(old))
    with pytest.raises(RuntimeError, match="refit"):
        kp.config_result(old[0], [42, 7, 99], lambda name: (_ for _ in ()).throw(RuntimeError("refit")))


def test_km_plugin_plot_draws_a_panel_per_seed_count(rows, tmp_path):
    """bench/km_plugin.py --plot: one panel per number of seeds, written as a PNG."""
    import km_plugin as kp

    got = [kp.config_result(r, [42, 7, 99], None) for r in rows]
    got[0] = {**got[0], "n_seeds": 10}
    kp.plot(got, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_km_plugin_plot_leaves_out_the_cv_rule_where_runs_have_no_cv(rows, monkeypatch):
    """--plot on runs saved with --no-cv: a panel where some configuration has no CV curves draws the plug-in and the
    best fixed 1/tau only (no NaN bar for ess-or-capped); a panel where all have them draws all three."""
    import km_plugin as kp

    bare = {**rows[2], "outliers": ["e"], "seeds": [{"test": s["test"]} for s in rows[2]["seeds"]]}
    got = [kp.config_result(r, [42, 7, 99], None) for r in [*rows, bare]]
    got[0] = {**got[0], "n_seeds": 10}
    figs = []
    monkeypatch.setattr(kp, "save_figure", lambda fig, path: figs.append(fig))
    kp.plot(got, "unused.png")
    three, ten = figs[0].axes  # panels in order of seed count: 3 (t1 "b", t2 "c", t2 "e" without CV), 10 (t1 "a")
    heights = lambda ax: [b.get_height() for b in ax.patches]  # noqa: E731
    assert len(heights(three)) == 2 * 2 and np.isfinite(heights(three)).all()  # two groups x (plug-in, best fixed)
    assert len(heights(ten)) == 3 and np.isfinite(heights(ten)).all()


def test_km_plugin_noise_counts_the_losers_the_seeds_explain(rows):
    """bench/km_plugin.py --noise: per rule the losing configurations at the seeds run and the number expected on
    fewer seeds (the share of seed subsets whose mean loses), the median standard error; the first candidate's losing
    configurations with mean ± standard error."""
    import km_plugin as kp

    first = kp.CANDIDATES[0]
    at = N - len(ts.BV) + ts.BV.index(f"bv:{first:g}")
    lost = row("t3", "leave-task-out", ["d"], [seed(d, {20.0: 0.5}) for d in (-1.2, 0.4, -0.6)])
    for s, d in zip(lost["seeds"], (-0.9, -0.3, -0.3)):
        s["test"]["outlier"][at] += d
    got = [kp.config_result(r, [42, 7, 99], None) for r in [*rows, lost]]
    table = kp.noise(got, subset=2).splitlines()
    # fixed 20: t1 "a" (-1.0 ± 0.29) loses on every pair of seeds; t3 on 2 of its 3 pairs (-0.4, -0.9, -0.1)
    # median standard error of the four configurations' outlier means: (0 + 0.29) / 2 (t3's is 0.47)
    assert "| fixed 1/tau = 20 | +0.400 | 2/0 | 1.7/0.0 | 0.14 |" in table
    # the candidate on t3: -0.9, -0.3, -0.3 loses as a mean and on 2 of its 3 pairs (-0.3 is not below -0.3)
    assert f"| {kp._name(first)} | +0.000 | 1/0 | 0.7/0.0 | 0.00 |" in table
    assert table[-1] == "| t3, leave-task-out, d | -0.50 ± 0.20 | 0.35 |"


def test_knn_plugin_fits_l2_from_training_pairs_and_minimizes_its_bound():
    """bench/knn_plugin.py (the kNN plug-in ablation): L² is 0 where every answer is the same and positive where the
    chance of a right answer rises along a direction; per query the 1/tau minimizes σ² Σ w² + c L² (Σ w φ)² over the
    grid, so no bias term (L² = 0) gives uniform weights (kNN's Base) and a larger c never smooths more."""
    import knn_plugin as kp

    from proxray import KNNRouter
    from proxray.routing.weights import proximity_weights

    rng = np.random.default_rng(5)
    X = rng.normal(size=(600, 4))
    p = 1 / (1 + np.exp(-3 * X[:, :1] / np.linalg.norm(X, axis=1, keepdims=True)))
    rising = (rng.uniform(size=(600, 3)) < np.repeat(p, 3, axis=1)) * 1.0
    assert kp.neighbour_stats(KNNRouter(k=20).fit(X, np.ones((600, 3))), seed=0) == 0.0
    r = KNNRouter(k=20).fit(X, rising)
    l2 = kp.neighbour_stats(r, seed=0)
    assert l2 > 0.3
    phi, ref, _ = r.neighbourhood(rng.normal(size=(40, 4)))
    (_, flat), = kp.plugin_weights(phi, ref, r.acc_values_, 0.0, weights=(1.0,))
    np.testing.assert_allclose(flat, proximity_weights(phi, 0.0))
    low, high = kp.plugin_weights(phi, ref, r.acc_values_, l2, weights=(0.01, 10.0))
    assert (high[0] >= low[0]).all() and (high[0] > low[0]).any()


def test_km_plugin_groups_compares_with_the_best_fixed_per_table_and_protocol(rows):
    """bench/km_plugin.py --groups: per table x protocol the candidate and auto against the best fixed 1/tau in
    hindsight, the paired difference's bootstrap interval re-choosing the best in each resample, and the fixed 1/tau
    chosen without each configuration (tau_selection.against_fixed, which --from-json's by_group uses too)."""
    import km_plugin as kp

    at = N - len(ts.BV) + ts.BV.index(f"bv:{kp.CANDIDATES[0]:g}")
    for r in rows:
        for s in r["seeds"]:
            s["test"]["overall"][at] += 0.7
    got = kp.groups([kp.config_result(r, [42, 7, 99], None) for r in rows], resamples=2000).splitlines()
    # t1: a gains 1.0 at 10 and 0.5 at 20, b 0.2 and 0.5: best 10 (+0.6); resamples {a,a} / {b,b} re-choose 10 / 20;
    # without a, 20 is chosen and a scores 0.5 there; without b, 10, where b scores 0.2
    assert got[2] == ("| t1, leave-task-out (2) | +0.700 | +0.500 | 10: +0.600 | +0.100 [-0.300, +0.200] | "
                      "-0.100 [-0.500, +0.000] | +0.350 |")
    assert got[3] == "| t2, few-shot-outlier (1) | +0.700 | +0.100 | 20: +0.100 | +0.600 [+0.600, +0.600] | " \
                     "+0.000 [+0.000, +0.000] | — |"


def test_km_plugin_reads_runs_saved_without_cv_curves(rows):
    """bench/km_plugin.py on a run saved with --no-cv (fresh11): the plug-in and the fixed 1/tau are read as before;
    ess-or-capped, which needs the CV curves, is left out where they are missing — its report row averages only the
    configurations that have them and says so, its group columns show "—", and nothing is NaN."""
    import km_plugin as kp

    cand = kp._name(kp.CANDIDATES[0])
    at = N - len(ts.BV) + ts.BV.index(f"bv:{kp.CANDIDATES[0]:g}")
    for r in rows:
        for s in r["seeds"]:
            s["test"]["overall"][at] += 0.7
    bare = {**rows[2], "outliers": ["e"], "seeds": [{"test": s["test"]} for s in rows[2]["seeds"]]}
    got = [kp.config_result(r, [42, 7, 99], None) for r in [*rows, bare]]
    assert np.isnan(got[3]["delta"]["overall"][kp.AUTO]) and got[3]["delta"]["overall"][cand] == pytest.approx(0.7)
    table = kp.report(got)
    assert f"| {kp.AUTO}, 3 of 4 (with CV curves) | +0.33 | +0.00 | +0.367 | 1/0 | +0.500 | — |" in table
    assert f"| {cand} | +0.00 | +0.00 | +0.700 | 0/0 | +0.700 | +0.700 |" in table
    groups = kp.groups(got, resamples=200).splitlines()
    assert groups[3] == ("| t2, few-shot-outlier (2) | +0.700 | — | 20: +0.100 | +0.600 [+0.600, +0.600] | — "
                         "| +0.100 |")
    assert "nan" not in table + "\n".join(groups) + kp.noise(got, subset=2) + kp.per_config(got)


def test_recheck_takes_the_routers_asked_for(rows, tmp_path):
    """--recheck --routers knn on a run whose KMeans rows have no CV curves (fresh11): kNN's losers under its auto
    (spr:0.2, no CV needed) are found, and the KMeans rows, whose auto cannot be read, are not asked about."""
    spr = ts.SETTINGS.index("spr:0.2")
    knn = {**rows[0], "router": "knn", "seeds": [{"test": {k: list(v[:N - len(ts.BV)]) for k, v in s["test"].items()}}
                                                  for s in rows[0]["seeds"]]}
    for s in knn["seeds"]:
        s["test"]["outlier"][spr] -= 0.4  # loses 0.4 pp outlier against Base
    km = {**rows[1], "seeds": [{"test": s["test"]} for s in rows[1]["seeds"]]}
    path = tmp_path / "fresh.json"
    path.write_text(json.dumps({"rows": [knn, km]}))
    assert ts.losers([path], ["knn"]) == [("t1", "knn", "leave-task-out", ["a"])]
    with pytest.raises(SystemExit, match="km auto rule"):
        ts.losers([path])


def test_rerun_takes_every_configuration_once(rows, tmp_path):
    """--rerun: every configuration of the saved runs of the routers asked for, each once (a configuration saved in
    two runs, e.g. on two sets of seeds, is run once), in the order first met."""
    knn = {**rows[2], "router": "knn"}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"rows": [rows[0], knn, rows[1]]}))
    b.write_text(json.dumps({"rows": [rows[1], rows[2]]}))
    km = [("t1", "km", "leave-task-out", ["a"]), ("t1", "km", "leave-task-out", ["b"]),
          ("t2", "km", "few-shot-outlier", ["c"])]
    assert ts.configurations([a, b], ["km"]) == km
    assert ts.configurations([a, b]) == [km[0], ("t2", "knn", "few-shot-outlier", ["c"]), *km[1:]]
    with pytest.raises(SystemExit):
        ts.main(["--rerun", str(a), "--recheck", str(b)])
