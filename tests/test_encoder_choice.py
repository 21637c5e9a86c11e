"""``proxray fit --encoder auto``: both encoders measured on the table's held-out tasks, the static one kept within
the tolerance, the comparison recorded in the artifact and shown by ``proxray info --router``."""
import json

import numpy as np
import pytest

from proxray.cli import main
from proxray.data.table import RoutingTable
from proxray.embeddings.encoder import SentenceEncoder, encoder_id
from proxray.experiments.encoder_choice import choose_encoder, decide, sample_rows
from proxray.experiments.protocols import evaluate
from proxray.routing.artifact import current_version

STATIC_ID, MINILM_ID = encoder_id("static"), encoder_id(None)


@pytest.fixture(scope="module")
def table(shared_data):
    t = RoutingTable.read(shared_data / "routerbench_slice.parquet")
    return t.subset(t.query_ids[::16])  # 198 queries, 3 tasks


def test_the_sample_keeps_every_task_in_proportion():
    tasks = np.array(["a"] * 900 + ["b"] * 90 + ["c"] * 10)
    rows = sample_rows(tasks, 100, seed=3)
    picked = tasks[rows]
    assert len(rows) == 100 and len(set(rows)) == 100
    assert {t: int((picked == t).sum()) for t in "abc"} == {"a": 90, "b": 9, "c": 1}
    np.testing.assert_array_equal(sample_rows(tasks, 100, seed=3), rows)  # seeded
    np.testing.assert_array_equal(sample_rows(tasks, 5000), np.arange(1000))  # small tables whole


@pytest.mark.slow
def test_the_choice_is_the_rule_applied_to_measured_scores(table):
    acc, cost = table.matrices()
    strict = choose_encoder(table.prompts, acc, cost, table.tasks, router="km", tolerance_pp=0.0)
    assert strict["held_out_tasks"] and set(strict["scores"]) == {STATIC_ID, MINILM_ID}
    # each score is the protocol's own Prox AUC: recomputed here for one held-out task
    X = SentenceEncoder(None).encode(table.prompts)
    t = strict["held_out_tasks"][0]
    res = evaluate(X, acc, cost, table.tasks, router="km", protocol="leave-task-out", outliers=[t], seeds=(42,))
    assert strict["scores"][MINILM_ID]["per_task"][t] == pytest.approx(res["splits"]["overall"]["prox"], abs=1e-3)
    gap = strict["scores"][STATIC_ID]["overall"] - strict["scores"][MINILM_ID]["overall"]
    assert strict["gap_pp"] == pytest.approx(gap, abs=1e-3)
    assert strict["chosen"] == ("static" if gap >= 0 else None)
    assert decide(strict, abs(gap) + 0.01)["chosen"] == "static"
    assert decide(strict, 0.0) == strict
    better, worse = (dict(strict, scores={**strict["scores"], STATIC_ID: dict(strict["scores"][STATIC_ID],
                                                                               overall=strict["scores"][MINILM_ID]["overall"] + d)})
                     for d in (0.3, -0.3))
    assert decide(better, 0.0)["chosen"] == "static" and decide(worse, 0.0)["chosen"] is None
    assert decide(worse, 0.31)["chosen"] == "static" and decide(worse, 0.29)["chosen"] is None
    assert decide(worse, 0.29)["reason"] == "static more than 0.29 pp of MiniLM on mean overall AUC (-0.30 pp)"


@pytest.mark.slow
def test_fit_auto_records_the_comparison_and_info_shows_it(table, tmp_path, capsys):
    table.write(tmp_path / "t.parquet")
    assert main(["fit", "--table", str(tmp_path / "t.parquet"), "--router", "knn", "--k", "20", "--encoder", "auto",
                 "--encoder-tolerance", "100", "--out", str(tmp_path / "r")]) == 0
    manifest = json.loads((current_version(tmp_path / "r") / "manifest.json").read_text())
    choice = manifest["encoder_choice"]
    assert manifest["encoder_id"] == STATIC_ID == choice["chosen_id"]  # within 100 pp: static
    assert choice["protocol"] == "few-shot-outlier" and choice["tolerance_pp"] == 100.0
    assert choice["n_queries"] == table.n_queries and set(choice["scores"]) == {STATIC_ID, MINILM_ID}
    capsys.readouterr()
    assert main(["info", "--router", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert f"encoder: {STATIC_ID}" in out and "within 100 pp of MiniLM" in out
    assert f"{MINILM_ID}: overall {choice['scores'][MINILM_ID]['overall']:.2f}" in out
    # without --encoder auto the manifest has no comparison, and info says nothing about one
    assert main(["fit", "--table", str(tmp_path / "t.parquet"), "--router", "knn", "--k", "20", "--encoder", "static",
                 "--out", str(tmp_path / "plain")]) == 0
    assert "encoder_choice" not in json.loads((current_version(tmp_path / "plain") / "manifest.json").read_text())


def test_bad_auto_settings_fail_before_encoding(table, tmp_path, capsys, monkeypatch):
    import proxray.embeddings.encoder as enc

    table.write(tmp_path / "t.parquet")
    monkeypatch.setattr(enc.SentenceEncoder, "encode", lambda *a, **k: pytest.fail("encoded"))
    base = ["fit", "--table", str(tmp_path / "t.parquet"), "--encoder", "auto", "--out", str(tmp_path / "r")]
    assert main([*base, "--encoder-tolerance", "-1"]) == 2
    assert "--encoder-tolerance -1.0: must be a number of percentage points >= 0" in capsys.readouterr().err
    assert main([*base, "--encoder-sample", "10"]) == 2
    assert "--encoder-sample 10: must be at least 100 queries" in capsys.readouterr().err
    one = table.subset([q for q, t in zip(table.query_ids, table.tasks) if t == table.tasks[0]])
    one.write(tmp_path / "one.parquet")
    assert main(["fit", "--table", str(tmp_path / "one.parquet"), "--encoder", "auto", "--out", str(tmp_path / "r")]) == 2
    assert "the table has 1 task(s), at least 2 are needed" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
