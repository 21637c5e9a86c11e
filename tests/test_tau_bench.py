"""bench/tau_selection.py's readings of saved runs: losing configurations, the per table x protocol comparison with
the best fixed 1/tau, the noise estimate and --recheck's choice of configurations (crafted runs, no encoding)."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
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
