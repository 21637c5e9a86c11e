import numpy as np
import pandas as pd
import pytest

from proxray import RoutingTable, TableValidationError


def long_frame(n=4, models=("m1", "m2"), cost=True):
    rows = []
    for i in range(n):
        for j, m in enumerate(models):
            r = {"query_id": f"q{i}", "task": "t" + str(i % 2), "prompt": f"prompt {i}", "model": m,
                 "correct": float((i + j) % 2)}
            if cost:
                r["cost"] = 0.001 * (j + 1)
            rows.append(r)
    return pd.DataFrame(rows)


def test_matrices_in_stated_order():
    df = long_frame().sample(frac=1.0, random_state=1)  # row order must not matter
    t = RoutingTable(df)
    acc, cost = t.matrices()
    assert t.models == ["m1", "m2"]
    for qi, q in enumerate(t.query_ids):
        i = int(q[1:])
        np.testing.assert_array_equal(acc[qi], [(i) % 2, (i + 1) % 2])
        assert t.prompts[qi] == f"prompt {i}"
    np.testing.assert_allclose(cost[:, 1], 0.002)
    acc2, _ = t.matrices(models=["m2", "m1"])
    np.testing.assert_array_equal(acc2, acc[:, ::-1])


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_roundtrip_formats(tmp_path, fmt):
    df = long_frame()
    df["split"] = "train"
    df["response"] = "A"
    df["input_tokens"] = 12
    df["output_tokens"] = 3
    t = RoutingTable(df)
    path = t.write(tmp_path / f"t.{fmt}")
    t2 = RoutingTable.read(path)
    for a, b in zip(t.matrices(), t2.matrices()):
        np.testing.assert_array_equal(a, b)
    assert t2.query_ids == t.query_ids and t2.prompts == t.prompts and list(t2.splits) == ["train"] * 4
    assert t2.df["input_tokens"].tolist() == [12] * 8


def test_no_cost_table():
    t = RoutingTable(long_frame(cost=False))
    acc, cost = t.matrices()
    assert cost is None and not t.has_cost and acc.shape == (4, 2)


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.iloc[0:0], "the table is empty"),
    (lambda d: d.drop(columns=["prompt"]), "missing required column(s) prompt"),
    (lambda d: d.assign(correct=d.correct.where(d.index != 3, 1.5)), "column 'correct': outside [0, 1] at row 3 (1.5)"),
    (lambda d: d.assign(correct=d.correct.astype(object).where(d.index != 2, "yes")), "column 'correct': not a number at row 2 ('yes')"),
    (lambda d: d.assign(correct=d.correct.where(d.index != 5, np.nan)), "column 'correct': missing or NaN at row 5"),
    (lambda d: d.assign(cost=d.cost.where(d.index != 4, -1.0)), "column 'cost': negative at row 4 (-1.0)"),
    (lambda d: d.assign(cost=d.cost.where(d.index != 6, np.nan)), "column 'cost': NaN at row 6"),
    (lambda d: d.assign(cost=d.cost.where(d.index != 1, np.inf)), "column 'cost': infinite at row 1"),
    (lambda d: pd.concat([d, d.iloc[[2]]], ignore_index=True), "duplicate pair at row 8 ('q1', 'm1')"),
    (lambda d: d.assign(model=d.model.where(d.index != 0, None)), "column 'model': empty value at row 0"),
    (lambda d: d.assign(query_id=d.query_id.astype(object).where(d.index != 0, 7)), "column 'query_id': not a string at row 0 (7)"),
    (lambda d: d.assign(task=d.task.where(d.index != 1, "other")), "column 'task': query_id 'q0' has 2 different values"),
    (lambda d: d.assign(input_tokens=[1.5] + [1] * (len(d) - 1)), "column 'input_tokens': not a whole number >= 0 at row 0"),
])
def test_validation_errors_name_column_row_rule(mutate, message):
    with pytest.raises(TableValidationError) as e:
        RoutingTable(mutate(long_frame()))
    assert message in str(e.value), str(e.value)


def test_all_problems_reported_at_once():
    df = long_frame()
    df.loc[0, "correct"] = 2.0
    df.loc[1, "cost"] = -3.0
    with pytest.raises(TableValidationError) as e:
        RoutingTable(df)
    assert len(e.value.problems) == 2


def test_missing_models_policy():
    df = long_frame(n=5).iloc[:-1]  # q4 lacks m2
    t = RoutingTable(df)
    assert t.n_queries == 4 and t.report.dropped_queries == {"q4": ["m2"]}
    assert "dropped 1 queries" in str(t.report)
    with pytest.raises(TableValidationError, match="1 queries lack results for some models .'q4' lacks m2"):
        RoutingTable(df, missing="error")
    with pytest.raises(ValueError, match="missing='keep'"):
        RoutingTable(df, missing="keep")


def test_append_model_and_queries():
    t = RoutingTable(long_frame(models=("m1", "m2")))
    new_model = long_frame(models=("m1", "m2", "m3"))
    new_model = new_model[new_model.model == "m3"]
    t2 = t.append(new_model)
    assert t2.models == ["m1", "m2", "m3"] and t2.n_queries == 4
    more = long_frame(n=6)
    t3 = t.append(more[more.query_id.isin(["q4", "q5"])])
    assert t3.n_queries == 6
    with pytest.raises(TableValidationError, match="duplicate pair"):
        t.append(long_frame().iloc[:1])


def test_from_matrices_roundtrip(rng):
    acc = rng.uniform(size=(7, 3))
    cost = rng.uniform(size=(7, 3))
    t = RoutingTable.from_matrices(acc, cost, models=["c", "a", "b"])
    a2, c2 = t.matrices(models=["c", "a", "b"])
    np.testing.assert_allclose(a2, acc)
    np.testing.assert_allclose(c2, cost)


def test_real_tables_load(shared_data):
    for name, q, m, has_cost in [("routerbench_slice", 3164, 11, True), ("routerdc7", 20600, 7, False),
                                 ("bbh19_dev", 3000, 19, True)]:
        t = RoutingTable.read(shared_data / f"{name}.parquet")
        acc, cost = t.matrices()
        assert acc.shape == (q, m) and not np.isnan(acc).any()
        assert t.has_cost == has_cost
