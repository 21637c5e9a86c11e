import json

import numpy as np
import pytest

from proxray.cli import main
from proxray.experiments.protocols import evaluate, protocol_split
from proxray.experiments.report import format_result
from proxray.pool.simulated import make_table


@pytest.fixture(scope="module")
def synth(encoder):
    t = make_table(60, seed=0)
    acc, cost = t.matrices()
    return t, encoder.encode(t.prompts), acc, cost


def test_leave_task_out_split():
    tasks = np.repeat(["a", "b", "c"], 50)
    sp = protocol_split(tasks, ["c"], "leave-task-out", seed=42)
    assert not (set(sp.base_train) & set(sp.test))
    assert set(tasks[sp.base_train]) == {"a", "b"}
    assert len(sp.base_train) == 60 and len(sp.allsee_train) == 90 and len(sp.test) == 60
    assert not (set(sp.allsee_train) & set(sp.test))  # AllSee never saw a test query
    assert (tasks[sp.test][sp.test_outlier] == "c").all() and (tasks[sp.test][~sp.test_outlier] != "c").all()
    again = protocol_split(tasks, ["c"], "leave-task-out", seed=42)
    np.testing.assert_array_equal(sp.test, again.test)
    assert not np.array_equal(protocol_split(tasks, ["c"], "leave-task-out", seed=7).test, sp.test)


def test_few_shot_split():
    tasks = np.repeat(["a", "b", "c"], 50)
    sp = protocol_split(tasks, ["c"], "few-shot-outlier", seed=42, few_shot=5)
    shots = sp.base_train[tasks[sp.base_train] == "c"]
    assert len(shots) == 5 and set(shots) <= set(sp.allsee_train) and not (set(shots) & set(sp.test))


def test_split_errors():
    tasks = np.repeat(["a", "b"], 5)
    with pytest.raises(ValueError, match=r"outlier task\(s\) \['z'\] are not in the table"):
        protocol_split(tasks, ["z"], "leave-task-out", 1)
    with pytest.raises(ValueError, match="at least one inlier"):
        protocol_split(tasks, ["a", "b"], "leave-task-out", 1)
    with pytest.raises(ValueError, match="protocol='x'"):
        protocol_split(tasks, ["a"], "x", 1)


def test_evaluate_shape_and_prox_helps_outliers(synth):
    t, X, acc, cost = synth
    res = evaluate(X, acc, cost, t.tasks, router="knn", protocol="few-shot-outlier", outliers=["gsm8k", "svamp"],
                   seeds=(42, 7), few_shot=10, k=50, temperature=20.0)
    assert set(res["splits"]) == {"outlier", "inlier", "overall"}
    for sp in res["splits"].values():
        assert set(sp) == {"base", "prox", "allsee", "random", "largest", "oracle"}
        assert all(0 <= v <= 100 for v in sp.values())
        assert sp["oracle"] >= max(sp["base"], sp["prox"], sp["allsee"], sp["random"])
    assert res["splits"]["outlier"]["prox"] > res["splits"]["outlier"]["base"]


def test_evaluate_with_the_spread_temperature_is_that_router(synth):
    """eval's --temperature spread:2: Prox is the router with that temperature (scored by hand here), not the fixed
    one; Base is the same."""
    from proxray import KMeansRouter
    from proxray.experiments.metrics import routing_score

    t, X, acc, cost = synth
    kw = dict(router="km", protocol="leave-task-out", outliers=["gsm8k"], seeds=(42,), n_clusters=8)
    spread, fixed = (evaluate(X, acc, cost, t.tasks, temperature=v, **kw) for v in ("spread:2", 2.0))
    assert spread["temperature"] == ["spread:2"] and fixed["temperature"] == ["fixed:2"]
    sp = protocol_split(t.tasks, ["gsm8k"], "leave-task-out", 42)
    r = KMeansRouter(n_clusters=8, temperature="spread:2", random_state=42).fit(
        X[sp.base_train], acc[sp.base_train], cost[sp.base_train])
    a_hat, c_hat = r.estimate(X[sp.test])
    want = routing_score(a_hat, c_hat, acc[sp.test], cost[sp.test])
    assert spread["splits"]["overall"]["prox"] == pytest.approx(want)
    assert spread["splits"]["overall"]["prox"] != pytest.approx(fixed["splits"]["overall"]["prox"])
    assert spread["splits"]["overall"]["base"] == pytest.approx(fixed["splits"]["overall"]["base"])


def test_eval_budgets_report_what_each_router_really_spends(synth):
    """``proxray eval --budgets``: per budget, each router's λ is calibrated on its own training queries and the
    spend is measured on the test split — all of it and apart on inlier and outlier queries. Prox's entry is
    recomputed by hand (calibrate on the training rows, route the test rows); inlier queries, like the training
    ones, stay within 10 % of the budget (here −4 % and +1 %); the split spends make up the whole."""
    from proxray import KNNRouter

    t, X, acc, cost = synth
    budgets = (3e-6, 5e-6)
    res = evaluate(X, acc, cost, t.tasks, router="knn", protocol="few-shot-outlier", outliers=["gsm8k", "svamp"],
                   seeds=(42,), few_shot=10, k=50, budgets=budgets)
    sp = protocol_split(t.tasks, ["gsm8k", "svamp"], "few-shot-outlier", 42, 10)
    r = KNNRouter(k=50, temperature="auto").fit(
        X[sp.base_train], acc[sp.base_train], cost[sp.base_train])
    rows, out = np.arange(len(sp.test)), sp.test_outlier
    assert [b["budget"] for b in res["budgets"]] == list(budgets)
    for b, got in zip(budgets, res["budgets"]):
        lam = r.calibrate(X[sp.base_train], target_cost=b)
        pick = r.route(X[sp.test], lam=lam)
        paid = cost[sp.test][rows, pick]
        prox = got["prox"]
        assert prox["lam"] == pytest.approx(lam)
        assert prox["accuracy"] == pytest.approx(100 * acc[sp.test][rows, pick].mean())
        assert (prox["cost"], prox["cost_inlier"], prox["cost_outlier"]) == pytest.approx(
            (paid.mean(), paid[~out].mean(), paid[out].mean()))
        assert abs(prox["cost_inlier"] / b - 1) <= 0.10, (b, prox)
        for name in ("base", "prox", "allsee"):
            e = got[name]
            assert e["cost"] == pytest.approx((1 - out.mean()) * e["cost_inlier"] + out.mean() * e["cost_outlier"])
    text = format_result(res)
    assert "all queries (inlier; outlier queries)" in text
    assert f"{prox['cost']:.3g} ({prox['cost_inlier']:.3g}; {prox['cost_outlier']:.3g})" in text


def test_accuracy_only_tables(synth):
    t, X, acc, _ = synth
    res = evaluate(X, acc, None, t.tasks, router="km", outliers=["medqa"], seeds=(42,), n_clusters=8, temperature=20.0)
    assert res["metric"] == "accuracy"
    s = res["splits"]["overall"]
    assert s["random"] < s["base"] <= s["oracle"]


@pytest.mark.slow
def test_eval_command_json_and_plots(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    assert main(["eval", "--n-per-task", "40", "--seeds", "42,7", "--clusters", "8", "--budgets", "5e-6,1e-5",
                 "--json", str(out), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "KM-Prox" in printed and "outlier" in printed
    res = json.loads(out.read_text())
    assert set(res) >= {"router", "protocol", "outliers", "temperature", "splits", "std", "budgets"}
    assert res["outliers"] == ["hellaswag", "medqa"] and res["temperature"] == ["plug-in:0.125"] * 2
    assert [b["budget"] for b in res["budgets"]] == [5e-6, 1e-5]
    assert set(res["budgets"][0]["prox"]) == {"lam", "accuracy", "cost", "cost_inlier", "cost_outlier", "best_single"}
    assert png.stat().st_size > 10_000
    # with budgets, two more panels (accuracy at each budget, spend against budget): 5 × 5 in at 120 dpi instead of 3
    assert int.from_bytes(png.read_bytes()[16:20], "big") == 3000
    sweep_png = tmp_path / "s.png"
    assert main(["eval", "--n-per-task", "40", "--seeds", "42", "--clusters", "8", "--sweep", "inv-tau=0,20,inf",
                 "--plot", str(sweep_png), "--json", str(tmp_path / "s.json")]) == 0
    rows = json.loads((tmp_path / "s.json").read_text())["rows"]
    assert [r["value"] for r in rows] == [0.0, 20.0, "inf"]
    # 1/tau = inf is the hard router: KM-Prox equals KM-Base there
    assert rows[2]["splits"]["overall"]["prox"] == pytest.approx(rows[2]["splits"]["overall"]["base"])
    assert sweep_png.stat().st_size > 10_000


def test_eval_needs_outliers_with_a_table(tmp_path, capsys):
    make_table(5).write(tmp_path / "t.parquet")
    assert main(["eval", "--table", str(tmp_path / "t.parquet")]) == 2
    assert "--outliers is required" in capsys.readouterr().err


def test_eval_refuses_a_bad_temperature_before_encoding(capsys):
    assert main(["eval", "--n-per-task", "5", "--temperature", "warm"]) == 2
    err = capsys.readouterr().err
    assert "--temperature warm: temperature='warm': expected a number >= 0" in err and "encoding" not in err
    assert main(["eval", "--n-per-task", "5", "--cv-rule", "shifted"]) == 2
    err = capsys.readouterr().err
    assert "--cv-rule shifted: the cross-validated temperature rules are not part of proxray" in err
    assert "research/tau" in err and "encoding" not in err


def test_kmeans_auto_is_the_plug_in_temperature_without_cv(synth, monkeypatch):
    """KMeans' auto is the plug-in temperature at c = 0.125: Prox is KMeansRouter(temperature=PlugIn(0.125)), scored
    by hand here; evaluate reports it per seed."""
    import proxray.experiments.protocols as ex
    from proxray import KMeansRouter
    from proxray.experiments.metrics import routing_score
    from proxray.routing.temperature import PlugIn

    t, X, acc, cost = synth
    kw = dict(router="km", protocol="leave-task-out", outliers=["medqa", "hellaswag"], n_clusters=16)
    auto = ex.run_once(X, acc, cost, t.tasks, seed=42, **kw)
    assert auto["temperature"] == "plug-in:0.125"
    sp = protocol_split(t.tasks, kw["outliers"], kw["protocol"], 42)
    r = KMeansRouter(n_clusters=16, random_state=42, temperature=PlugIn(0.125)).fit(
        X[sp.base_train], acc[sp.base_train], cost[sp.base_train])
    want = routing_score(*r.estimate(X[sp.test]), acc[sp.test], cost[sp.test])
    assert auto["scores"]["overall"]["prox"] == pytest.approx(want)
    res = evaluate(X, acc, cost, t.tasks, seeds=(42, 7), **kw)
    assert res["temperature"] == ["plug-in:0.125", "plug-in:0.125"]
    assert "(plug-in:c = per query the 1/tau minimizing the bias–variance bound" in format_result(res)


def test_knn_auto_is_the_spread_temperature_without_cv(synth, monkeypatch):
    """kNN's auto is the spread temperature at c = 0.2: Prox is KNNRouter(temperature=Spread(0.2)), scored by hand
    here, and differs from a fixed 1/tau; a temperature chosen per seed by a callable (the hook research/tau's CV
    rules use) sees the training split only and is what Prox runs with; the plug-in temperature is refused for
    kNN, by name."""
    import proxray.experiments.protocols as ex
    from proxray import KNNRouter
    from proxray.experiments.metrics import routing_score
    from proxray.routing.temperature import Fixed, Spread

    t, X, acc, cost = synth
    kw = dict(router="knn", protocol="few-shot-outlier", outliers=["gsm8k", "svamp"], few_shot=10, k=50)
    auto = ex.run_once(X, acc, cost, t.tasks, seed=42, **kw)
    assert auto["temperature"] == "spread:0.2"
    sp = protocol_split(t.tasks, kw["outliers"], kw["protocol"], 42, few_shot=10)
    r = KNNRouter(k=50, temperature=Spread(0.2)).fit(X[sp.base_train], acc[sp.base_train], cost[sp.base_train])
    want = routing_score(*r.estimate(X[sp.test]), acc[sp.test], cost[sp.test])
    assert auto["scores"]["overall"]["prox"] == pytest.approx(want)
    seen = []

    def rule(Xtr, acc_tr, cost_tr, tasks_tr, router, hp, protocol, few_shot, seed):
        seen.append((len(Xtr), router, protocol, few_shot, seed))
        return Fixed(5.0)

    chosen = ex.run_once(X, acc, cost, t.tasks, seed=42, temperature=rule, **{k: v for k, v in kw.items()})
    assert seen == [(len(sp.base_train), "knn", "few-shot-outlier", 10, 42)] and chosen["temperature"] == "fixed:5"
    assert chosen["scores"]["overall"]["prox"] != pytest.approx(want)
    res = evaluate(X, acc, cost, t.tasks, seeds=(42, 7), **kw)
    assert res["temperature"] == ["spread:0.2", "spread:0.2"]
    with pytest.raises(ValueError, match="temperature='plug-in:0.125' does not apply to router='knn'"):
        ex.run_once(X, acc, cost, t.tasks, seed=42, temperature="plug-in", **kw)


def test_eval_refuses_the_bv_temperature_for_knn_and_a_bad_weight_before_encoding(capsys):
    """--temperature plug-in:C is KMeans' plug-in temperature: kNN and an infinite bias weight are refused, naming
    them, before any encoding — in today's spelling and in the deprecated --inv-tau C --temperature bv."""
    from proxray.cli import main

    assert main(["eval", "--router", "knn", "--temperature", "plug-in:0.125", "--n-per-task", "5"]) == 2
    err = capsys.readouterr().err
    assert "does not apply to router='knn'" in err and "encoding" not in err
    assert main(["eval", "--router", "knn", "--inv-tau", "0.125", "--temperature", "bv", "--n-per-task", "5"]) == 2
    assert "does not apply to router='knn'" in capsys.readouterr().err
    assert main(["eval", "--router", "km", "--temperature", "plug-in:inf", "--n-per-task", "5"]) == 2
    assert "plug-in:inf: must be a finite number >= 0" in capsys.readouterr().err
