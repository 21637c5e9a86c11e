import json

import numpy as np
import pandas as pd

from proxray import KMeansRouter, KNNRouter, RoutingTable
from proxray.artifact import current_version
from proxray.cli import main


def test_import_routerdc_and_info(tmp_path, shared_data, capsys):
    files = [str(p) for p in sorted((shared_data / "raw" / "routerdc7").glob("humaneval*.json"))]
    out = tmp_path / "he.parquet"
    assert main(["import", "routerdc", *files, "--out", str(out)]) == 0
    t = RoutingTable.read(out)
    assert t.n_queries == 164 and len(t.models) == 7 and set(t.splits) == {"train", "test"}
    assert main(["info", str(out)]) == 0
    assert "accuracy_%" in capsys.readouterr().out


def test_import_error_is_reported_not_raised(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"query_id": ["a"], "task": ["t"], "prompt": ["p"], "model": ["m"], "correct": [3.0]}).to_csv(bad, index=False)
    assert main(["info", str(bad)]) == 2
    assert "column 'correct': outside [0, 1] at row 0 (3.0)" in capsys.readouterr().err


def test_fit_writes_a_loadable_artifact(tmp_path, shared_data):
    t = RoutingTable.read(shared_data / "routerbench_slice.parquet")
    small = t.subset(t.query_ids[::40])
    small.write(tmp_path / "small.parquet")
    assert main(["fit", "--table", str(tmp_path / "small.parquet"), "--router", "knn", "--k", "10",
                 "--out", str(tmp_path / "art")]) == 0
    r = KNNRouter.load(tmp_path / "art", encoder_id="sentence-transformers/all-MiniLM-L6-v2")
    assert r.n_train_ == small.n_queries and r.models_ == small.models
    manifest = json.loads((current_version(tmp_path / "art") / "manifest.json").read_text())
    assert manifest["dim"] == 384 and manifest["params"]["k"] == 10
    assert np.isfinite(r.estimate(np.ones((1, 384), np.float32))[0]).all()
    # --inv-tau auto is the default: kNN's is the spread temperature, KMeans' the plug-in temperature (neither a CV)
    assert (r.inv_tau, r.temperature) == (0.2, "spread")
    assert main(["fit", "--table", str(tmp_path / "small.parquet"), "--router", "km", "--clusters", "4",
                 "--out", str(tmp_path / "km")]) == 0
    km = KMeansRouter.load(tmp_path / "km", encoder_id="sentence-transformers/all-MiniLM-L6-v2")
    assert (km.temperature, km.inv_tau) == ("bv", 0.125)
    assert main(["fit", "--table", str(tmp_path / "small.parquet"), "--router", "knn", "--inv-tau", "0.125",
                 "--temperature", "bv", "--out", str(tmp_path / "bad")]) == 2  # KMeans only, refused before fitting
    assert not (tmp_path / "bad").exists()
    assert main(["fit", "--table", str(tmp_path / "small.parquet"), "--inv-tau", "5", "--temperature", "spread",
                 "--out", str(tmp_path / "fixed")]) == 0
    fixed = KNNRouter.load(tmp_path / "fixed")
    assert (fixed.inv_tau, fixed.temperature) == (5.0, "spread")
    assert main(["fit", "--table", str(tmp_path / "small.parquet"), "--router", "km", "--clusters", "4", "--inv-tau", "2",
                 "--temperature", "ess", "--out", str(tmp_path / "ess")]) == 0
    ess = KMeansRouter.load(tmp_path / "ess")
    assert (ess.inv_tau, ess.temperature) == (2.0, "ess")


def test_fit_refuses_a_temperature_with_auto(tmp_path, capsys):
    assert main(["fit", "--temperature", "spread", "--out", str(tmp_path / "art")]) == 2
    assert "--temperature spread needs a number for --inv-tau" in capsys.readouterr().err
    assert main(["fit", "--inv-tau", "0.5", "--temperature", "ess", "--out", str(tmp_path / "art")]) == 2
    assert "inv_tau=0.5 with temperature='ess'" in capsys.readouterr().err
    assert main(["fit", "--inv-tau", "-1", "--out", str(tmp_path / "art")]) == 2
    assert "--inv-tau '-1': expected a number >= 0, inf, or auto" in capsys.readouterr().err
    assert not (tmp_path / "art").exists()
