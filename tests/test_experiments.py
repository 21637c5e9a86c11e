import json

import numpy as np
import pytest

from proxray.cli import main
from proxray.experiments import evaluate, format_result, protocol_split
from proxray.synthetic import make_table
from proxray.tuning import GRID, auto_inv_tau


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


def test_auto_tau_uses_training_data_only(synth):
    """Through the real protocol entry point (``run_once``): corrupting the test split and the outlier tasks
    (flipped labels, shuffled embeddings, tenfold costs) leaves the CV's chosen 1/tau as it is — and the same
    corruption does move the choice of a selection that reads those rows, so the check can fail. (KMeans' default
    auto, the plug-in temperature, chooses nothing before fitting: its per-query 1/tau reads the fitted router's
    clusters, which the training rows alone make; the CV rules remain options.)"""
    from proxray.experiments import run_once

    t, X, acc, cost = synth
    kw = dict(router="km", protocol="leave-task-out", outliers=["medqa", "hellaswag"], n_clusters=16,
              cv_rule="ess-or-capped")
    sp = protocol_split(t.tasks, kw["outliers"], kw["protocol"], seed=42)
    unseen = np.setdiff1d(np.arange(len(X)), sp.base_train)  # the test split and every unseen outlier row
    assert set(sp.test) <= set(unseen) and np.isin(t.tasks[unseen], kw["outliers"]).any()
    rng = np.random.default_rng(0)
    X2, acc2, cost2 = X.copy(), acc.copy(), cost.copy()
    acc2[unseen] = 1 - acc2[unseen]
    X2[unseen] = X2[rng.permutation(unseen)]
    cost2[unseen] *= 10
    clean = run_once(X, acc, cost, t.tasks, seed=42, **kw)["inv_tau"]
    assert run_once(X2, acc2, cost2, t.tasks, seed=42, **kw)["inv_tau"] == clean
    hp = {"n_clusters": 16, "k": 100, "random_state": 42}
    leaky = np.concatenate([sp.base_train, sp.test])  # what a leaking selection would read

    def chosen(X_, a_, c_):
        return auto_inv_tau(X_[leaky], a_[leaky], c_[leaky], t.tasks[leaky], "km", hp, seed=42)[0]

    assert chosen(X2, acc2, cost2) != chosen(X, acc, cost)
    _, scores = auto_inv_tau(X[sp.base_train], acc[sp.base_train], cost[sp.base_train], t.tasks[sp.base_train],
                             "km", hp, seed=42)
    means = [(o + i) / 2 for o, i in scores.values()]
    assert max(means) - min(means) > 0.5  # the CV scores really depend on tau (the choice is not a constant)


def test_evaluate_shape_and_prox_helps_outliers(synth):
    t, X, acc, cost = synth
    res = evaluate(X, acc, cost, t.tasks, router="knn", protocol="few-shot-outlier", outliers=["gsm8k", "svamp"],
                   seeds=(42, 7), few_shot=10, k=50, inv_tau=20.0)
    assert set(res["splits"]) == {"outlier", "inlier", "overall"}
    for sp in res["splits"].values():
        assert set(sp) == {"base", "prox", "allsee", "random", "largest", "oracle"}
        assert all(0 <= v <= 100 for v in sp.values())
        assert sp["oracle"] >= max(sp["base"], sp["prox"], sp["allsee"], sp["random"])
    assert res["splits"]["outlier"]["prox"] > res["splits"]["outlier"]["base"]


def test_evaluate_with_the_spread_temperature_is_that_router(synth):
    """eval's --temperature spread: Prox is the router with temperature="spread" (scored by hand here), not the
    fixed one; auto is refused with it (auto picks a fixed 1/tau)."""
    from proxray import KMeansRouter
    from proxray.metrics import routing_score

    t, X, acc, cost = synth
    kw = dict(router="km", protocol="leave-task-out", outliers=["gsm8k"], seeds=(42,), n_clusters=8, inv_tau=2.0)
    spread, fixed = evaluate(X, acc, cost, t.tasks, temperature="spread", **kw), evaluate(X, acc, cost, t.tasks, **kw)
    assert spread["temperature"] == "spread" and fixed["temperature"] == "fixed"
    sp = protocol_split(t.tasks, ["gsm8k"], "leave-task-out", 42)
    r = KMeansRouter(n_clusters=8, inv_tau=2.0, temperature="spread", random_state=42).fit(
        X[sp.base_train], acc[sp.base_train], cost[sp.base_train])
    a_hat, c_hat = r.estimate(X[sp.test])
    want = routing_score(a_hat, c_hat, acc[sp.test], cost[sp.test])
    assert spread["splits"]["overall"]["prox"] == pytest.approx(want)
    assert spread["splits"]["overall"]["prox"] != pytest.approx(fixed["splits"]["overall"]["prox"])
    assert spread["splits"]["overall"]["base"] == pytest.approx(fixed["splits"]["overall"]["base"])
    with pytest.raises(ValueError, match="temperature='spread' needs a number"):
        evaluate(X, acc, cost, t.tasks, temperature="spread", **{**kw, "inv_tau": "auto"})


def test_eval_budgets_report_what_each_router_really_spends(synth):
    """``proxray eval --budgets``: per budget, each router's λ is calibrated on its own training queries and the
    spend is measured on the test split — all of it and apart on inlier and outlier queries. Prox's entry is
    recomputed by hand (calibrate on the training rows, route the test rows); inlier queries, like the training
    ones, stay within 10 % of the budget (here −4 % and +1 %); the split spends make up the whole."""
    from proxray import KNNRouter
    from proxray.tuning import SPREAD_INV_TAU

    t, X, acc, cost = synth
    budgets = (3e-6, 5e-6)
    res = evaluate(X, acc, cost, t.tasks, router="knn", protocol="few-shot-outlier", outliers=["gsm8k", "svamp"],
                   seeds=(42,), few_shot=10, k=50, budgets=budgets)
    sp = protocol_split(t.tasks, ["gsm8k", "svamp"], "few-shot-outlier", 42, 10)
    r = KNNRouter(k=50, inv_tau=SPREAD_INV_TAU, temperature="spread").fit(
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
    res = evaluate(X, acc, None, t.tasks, router="km", outliers=["medqa"], seeds=(42,), n_clusters=8, inv_tau=20.0)
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
    assert set(res) >= {"router", "protocol", "outliers", "inv_tau", "splits", "std", "budgets"}
    assert res["outliers"] == ["hellaswag", "medqa"] and len(res["inv_tau"]) == 2
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


def test_eval_refuses_spread_with_auto_before_encoding(capsys):
    assert main(["eval", "--n-per-task", "5", "--temperature", "spread"]) == 2
    err = capsys.readouterr().err
    assert "--temperature spread needs a number for --inv-tau" in err and "encoding" not in err


def test_eval_refuses_an_ess_below_one_before_encoding(capsys):
    assert main(["eval", "--n-per-task", "5", "--temperature", "ess", "--inv-tau", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "inv_tau=0.5 with temperature='ess'" in err and "finite number >= 1" in err and "encoding" not in err
    assert main(["eval", "--n-per-task", "5", "--temperature", "ess", "--sweep", "inv-tau=2,0.5"]) == 2  # a swept value
    err = capsys.readouterr().err
    assert "inv_tau=0.5 with temperature='ess'" in err and "encoding" not in err


def test_eval_refuses_cv_repeats_below_one_before_encoding(capsys):
    assert main(["eval", "--n-per-task", "5", "--cv-repeats", "0"]) == 2
    err = capsys.readouterr().err
    assert "--cv-repeats 0: expected an integer >= 1" in err and "encoding" not in err


def test_run_once_passes_cv_repeats_and_rule_to_auto(synth, monkeypatch):
    """run_once's auto with a CV rule uses CV_REPEATS passes; KMeans' "ess-or-capped" (its default before the
    plug-in): one CV over the fixed grid and ess:3, resolved by select_ess_or_shifted with cap=SHIFT_CAP (so a fixed
    choice is shifted's own, or the cap where shifted's step passed it); cv_repeats / cv_rule say otherwise
    ("ess-or-shifted": the same CV, no cap); near-base and shifted never pick a smoother KMeans 1/tau than mean does
    here (they move toward inf; shifted from the smoothed curve's argmax, which can sit one step below mean's)."""
    import proxray.experiments as ex
    import proxray.tuning as tuning

    t, X, acc, cost = synth
    folds, rules = [], []
    real_folds, real_auto = tuning.cv_folds, tuning.auto_inv_tau
    monkeypatch.setattr(tuning, "cv_folds",
                        lambda *a, **kw: (folds.append((kw["repeats"], len(a[9]))), real_folds(*a, **kw))[1])
    monkeypatch.setattr(tuning, "auto_inv_tau", lambda *a, **kw: (rules.append(kw["rule"]), real_auto(*a, **kw))[1])
    kw = dict(router="km", protocol="leave-task-out", outliers=["medqa", "hellaswag"], n_clusters=16)
    auto = ex.run_once(X, acc, cost, t.tasks, seed=42, cv_rule="ess-or-capped", **kw)
    ex.run_once(X, acc, cost, t.tasks, seed=42, cv_repeats=1, cv_rule="ess-or-capped", **kw)
    shifted = ex.run_once(X, acc, cost, t.tasks, seed=42, cv_rule="shifted", **kw)["inv_tau"]
    mean = ex.run_once(X, acc, cost, t.tasks, seed=42, cv_rule="mean", **kw)["inv_tau"]
    near = ex.run_once(X, acc, cost, t.tasks, seed=42, cv_rule="near-base", **kw)["inv_tau"]
    lcb = ex.run_once(X, acc, cost, t.tasks, seed=42, cv_rule="lcb", **kw)["inv_tau"]  # reads the folds apart
    assert folds == [(3, len(GRID) + 1), (1, len(GRID) + 1)] + [(3, len(GRID))] * 4
    assert rules == ["shifted", "mean", "near-base", "lcb"]
    assert near >= mean and shifted >= mean and lcb in GRID
    assert auto["temperature"] == "ess" or auto["inv_tau"] in (shifted, tuning.SHIFT_CAP)
    sp = protocol_split(t.tasks, kw["outliers"], kw["protocol"], 42)
    got = tuning.auto_choice(X[sp.base_train], acc[sp.base_train], cost[sp.base_train], t.tasks[sp.base_train], "km",
                             {"n_clusters": 16, "random_state": 42}, seed=42, rule="ess-or-capped")
    assert got.rule == "ess-or-capped" and (got.inv_tau, got.temperature) == (auto["inv_tau"], auto["temperature"])
    assert list(got.curves)[-1] == "ess:3"
    out_cv, in_cv = np.array(list(got.curves.values())).T
    assert tuning.select_ess_or_shifted(out_cv, in_cv, cap=tuning.SHIFT_CAP) == (got.inv_tau, got.temperature)
    uncapped = ex.run_once(X, acc, cost, t.tasks, seed=42, cv_rule="ess-or-shifted", **kw)
    assert (uncapped["inv_tau"], uncapped["temperature"]) == tuning.select_ess_or_shifted(out_cv, in_cv)


def test_kmeans_auto_is_the_plug_in_temperature_without_cv(synth, monkeypatch):
    """KMeans' auto (rule "plug-in", tuning.DEFAULT_RULES) runs no CV: Prox is KMeansRouter(inv_tau=BV_WEIGHT,
    temperature="bv"), scored by hand here; evaluate reports it per seed."""
    import proxray.experiments as ex
    import proxray.tuning as tuning
    from proxray import KMeansRouter
    from proxray.metrics import routing_score

    t, X, acc, cost = synth
    cv_calls = []
    real = tuning.cv_folds
    monkeypatch.setattr(tuning, "cv_folds", lambda *a, **kw: (cv_calls.append(1), real(*a, **kw))[1])
    kw = dict(router="km", protocol="leave-task-out", outliers=["medqa", "hellaswag"], n_clusters=16)
    auto = ex.run_once(X, acc, cost, t.tasks, seed=42, **kw)
    assert (auto["inv_tau"], auto["temperature"], cv_calls) == (tuning.BV_WEIGHT, "bv", []) and tuning.BV_WEIGHT == 0.125
    sp = protocol_split(t.tasks, kw["outliers"], kw["protocol"], 42)
    r = KMeansRouter(n_clusters=16, random_state=42, inv_tau=0.125, temperature="bv").fit(
        X[sp.base_train], acc[sp.base_train], cost[sp.base_train])
    want = routing_score(*r.estimate(X[sp.test]), acc[sp.test], cost[sp.test])
    assert auto["scores"]["overall"]["prox"] == pytest.approx(want)
    res = evaluate(X, acc, cost, t.tasks, seeds=(42, 7), **kw)
    assert res["inv_tau"] == [0.125, 0.125] and res["temperature"] == ["bv", "bv"]
    assert "(bv c: per query the 1/tau minimizing the bias–variance bound" in ex.format_result(res)


def test_knn_auto_is_the_spread_temperature_without_cv(synth, monkeypatch):
    """kNN's auto (rule "spread", tuning.DEFAULT_RULES) runs no CV: Prox is KNNRouter(inv_tau=0.2,
    temperature="spread"), scored by hand here, and differs from the CV's fixed 1/tau (``cv_rule="shifted"``,
    which does run the CV); "spread" is refused for KMeans, naming the rules it allows."""
    import proxray.experiments as ex
    import proxray.tuning as tuning
    from proxray import KNNRouter
    from proxray.metrics import routing_score

    t, X, acc, cost = synth
    cv_calls = []
    real = tuning.cv_folds
    monkeypatch.setattr(tuning, "cv_folds", lambda *a, **kw: (cv_calls.append(1), real(*a, **kw))[1])
    kw = dict(router="knn", protocol="few-shot-outlier", outliers=["gsm8k", "svamp"], few_shot=10, k=50)
    auto = ex.run_once(X, acc, cost, t.tasks, seed=42, **kw)
    assert (auto["inv_tau"], auto["temperature"], cv_calls) == (0.2, "spread", [])
    sp = protocol_split(t.tasks, kw["outliers"], kw["protocol"], 42, few_shot=10)
    r = KNNRouter(k=50, inv_tau=0.2, temperature="spread").fit(X[sp.base_train], acc[sp.base_train], cost[sp.base_train])
    want = routing_score(*r.estimate(X[sp.test]), acc[sp.test], cost[sp.test])
    assert auto["scores"]["overall"]["prox"] == pytest.approx(want)
    cv = ex.run_once(X, acc, cost, t.tasks, seed=42, cv_rule="shifted", **kw)
    assert cv["temperature"] == "fixed" and cv["inv_tau"] in GRID and cv_calls == [1]
    assert cv["scores"]["overall"]["prox"] != pytest.approx(want)
    res = evaluate(X, acc, cost, t.tasks, seeds=(42, 7), **kw)
    assert res["inv_tau"] == [0.2, 0.2] and res["temperature"] == ["spread", "spread"]
    with pytest.raises(ValueError, match="rule='spread'.*kNN only.*allowed: mean, guarded, near-base, shifted"):
        ex.run_once(X, acc, cost, t.tasks, "km", "leave-task-out", ["gsm8k"], 42, n_clusters=8, cv_rule="spread")


def test_eval_refuses_spread_rule_for_kmeans_before_encoding(capsys):
    assert main(["eval", "--n-per-task", "5", "--cv-rule", "spread"]) == 2
    err = capsys.readouterr().err
    assert "--cv-rule spread: rule='spread'" in err and "kNN only" in err and "encoding" not in err


def test_eval_refuses_the_bv_temperature_for_knn_and_a_bad_weight_before_encoding(capsys):
    """--temperature bv is KMeans' plug-in temperature: kNN and a negative or infinite bias weight are refused,
    naming them, before any encoding."""
    from proxray.cli import main

    assert main(["eval", "--router", "knn", "--inv-tau", "0.125", "--temperature", "bv", "--n-per-task", "5"]) == 2
    err = capsys.readouterr().err
    assert "router='knn' has none (KMeans routers only)" in err and "encoding" not in err
    assert main(["eval", "--router", "km", "--inv-tau", "inf", "--temperature", "bv", "--n-per-task", "5"]) == 2
    assert "inv_tau=inf with temperature='bv'" in capsys.readouterr().err
