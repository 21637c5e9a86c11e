"""Property-based bad input for the table boundary and the importers: every input is either accepted
or refused with a TableValidationError / ValueError that names the problem — never another exception."""
import json
import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxray import RoutingTable, TableValidationError
from proxray.data.importers import read_routerdc

cells = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), st.text(max_size=4), st.none())


@settings(max_examples=200, deadline=None)
@given(correct=st.lists(cells, min_size=4, max_size=4), cost=st.lists(cells, min_size=4, max_size=4),
       qid=st.lists(st.one_of(st.sampled_from(["a", "b"]), st.none(), st.just("")), min_size=4, max_size=4))
@pytest.mark.slow
def test_tables_are_accepted_or_refused_with_a_named_rule(correct, cost, qid):
    df = pd.DataFrame({"query_id": qid, "task": "t", "prompt": "p", "model": ["m1", "m2", "m1", "m2"],
                       "correct": correct, "cost": cost})
    try:
        t = RoutingTable(df)
    except TableValidationError as e:
        assert e.problems and all(("column" in p) or ("table" in p) or ("queries" in p) or ("query" in p) for p in e.problems)
        return
    acc, c = t.matrices()
    assert ((acc >= 0) & (acc <= 1)).all()
    assert c is None or (c >= 0).all() and all(math.isfinite(x) for x in c.ravel())


json_values = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                           max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(payload=st.one_of(json_values, st.lists(st.fixed_dictionaries(
    {"question": st.one_of(st.text(max_size=10), st.integers()),
     "scores": st.dictionaries(st.sampled_from(["m1", "m2"]), cells, max_size=2)}), max_size=3)))
def test_routerdc_importer_refuses_junk_cleanly(tmp_path_factory, payload):
    path = tmp_path_factory.mktemp("dc") / "task-train.json"
    path.write_text(json.dumps(payload))
    try:
        t = read_routerdc([path])
    except ValueError as e:  # TableValidationError is a ValueError too
        assert str(e)
        return
    assert t.n_queries >= 1


@settings(max_examples=50, deadline=None)
@given(raw=st.binary(max_size=300))
def test_non_utf8_and_garbage_files_are_refused_cleanly(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("bin") / "t.jsonl"
    path.write_bytes(raw)
    try:
        RoutingTable.read(path)
    except (ValueError, UnicodeDecodeError) as e:
        assert str(e)
