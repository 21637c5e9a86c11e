import numpy as np
import pandas as pd
import pytest

from proxray import RoutingTable
from proxray.data.importers import load_routerbench_hf, read_routerbench, read_routerdc, split_from_name, strip_few_shot


def canonical(shared_data, name):
    return RoutingTable.read(shared_data / f"{name}.parquet")


def test_split_from_name():
    assert split_from_name("gsm8k-train") == ("gsm8k", "train")
    assert split_from_name("arc_challenge_test") == ("arc_challenge", "test")
    assert split_from_name("ceval") == ("ceval", "all")


def test_strip_few_shot():
    p = "['Q1?\\nAnswer:\\nA\\n\\nQ2?\\nAnswer:']"
    assert strip_few_shot(p) == "Q2?\nAnswer:"
    assert strip_few_shot("plain question") == "plain question"


def test_routerbench_csv_matches_canonical_table(shared_data):
    files = sorted((shared_data / "raw" / "routerbench_slice").glob("*.csv"))
    t = read_routerbench(files)
    ref = canonical(shared_data, "routerbench_slice")
    # the canonical table dropped the 154 missing cells; the importer leaves them out too
    merged = ref.df.merge(t.df, on=["query_id", "model"], suffixes=("", "_imp"))
    assert len(merged) == len(ref.df)
    assert (merged.prompt == merged.prompt_imp).mean() > 0.99
    np.testing.assert_allclose(merged.correct, merged.correct_imp)
    np.testing.assert_allclose(merged.cost, merged.cost_imp)
    assert (merged.split == merged.split_imp).all() and (merged.task == merged.task_imp).all()


def test_routerbench_pickle_same_as_csv(tmp_path, shared_data):
    csv = shared_data / "raw" / "routerbench_slice" / "winograde_test.csv"
    pkl = tmp_path / "winograde_test.pkl"
    pd.read_csv(csv).to_pickle(pkl)
    with pytest.raises(ValueError, match="refusing to unpickle"):
        read_routerbench([pkl])
    a, b = read_routerbench([csv]), read_routerbench([pkl], trust_pickle=True)
    assert a.query_ids == b.query_ids
    for x, y in zip(a.matrices(), b.matrices()):
        np.testing.assert_array_equal(x, y)


def test_routerbench_missing_cells_policy(shared_data):
    csv = shared_data / "raw" / "routerbench_slice" / "arc_challenge_test.csv"
    wide = pd.read_csv(csv)
    cells = [c for c in wide.columns if "|" not in c or c.endswith("|total_cost")]
    cells = [c for c in cells if c not in ("sample_id", "prompt", "eval_name", "oracle_model_to_route_to", "Unnamed: 0")]
    n_incomplete = int(wide[cells].isna().any(axis=1).sum())
    assert n_incomplete > 0  # this file has missing cells: the policy is exercised
    t = read_routerbench([csv])
    # every query id ends up either in the table or in the report of dropped queries
    assert t.n_queries + len(t.report.dropped_queries) == wide.sample_id.nunique()
    assert 0 < len(t.report.dropped_queries) <= n_incomplete
    with pytest.raises(ValueError, match="lack results for some models"):
        read_routerbench([csv], missing="error")


def test_routerdc_json_matches_canonical_table(shared_data):
    files = sorted((shared_data / "raw" / "routerdc7").glob("*.json"))
    t = read_routerdc(files)
    ref = canonical(shared_data, "routerdc7")
    assert t.n_queries == ref.n_queries and t.models == ref.models
    merged = ref.df.merge(t.df, on=["query_id", "model"], suffixes=("", "_imp"))
    assert len(merged) == len(ref.df)
    np.testing.assert_allclose(merged.correct, merged.correct_imp)
    assert (merged.task == merged.task_imp).all() and (merged.split == merged.split_imp).all()
    assert not t.has_cost


def test_routerdc_bad_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('[{"question": "q"}]')
    with pytest.raises(ValueError, match="item 0 is not an object with 'question' and 'scores'"):
        read_routerdc([p])


def test_huggingface_loader_offline(tmp_path, shared_data):
    """The HF path with the download step pointed at a local file of the dataset's layout."""
    pkl = tmp_path / "routerbench_0shot.pkl"
    pd.read_csv(shared_data / "raw" / "routerbench_slice" / "mbpp_test.csv").to_pickle(pkl)
    calls = []

    def download(repo_id, filename, revision):
        calls.append((repo_id, filename, revision))
        return tmp_path / filename

    t = load_routerbench_hf(download=download, trust_pickle=True)
    assert calls == [("withmartian/routerbench", "routerbench_0shot.pkl", None)]
    assert t.n_queries > 100 and set(t.tasks) == {"mbpp"}
