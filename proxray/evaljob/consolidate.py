"""The job's results from its parts: ``routing_table.parquet`` (queries that have every model), ``summary.md`` /
``summary.csv`` (model × task, like the paper's Table 2) and ``errors.parquet`` (failures not yet resolved)."""
from __future__ import annotations

import pandas as pd

from proxray.common.logs import log
from proxray.common.storage import Store
from proxray.evaljob.keys import current_rows


def consolidate(store: Store, keys: pd.DataFrame) -> dict:
    """routing_table.parquet (queries with every model), summary.md/.csv, errors.parquet — from the
    rows whose fingerprints the config gives now, each file written atomically."""
    from proxray.data.table import RoutingTable

    model_ids = list(dict.fromkeys(keys["model"]))
    parts = store.read_parts("table")
    table_rows = current_rows(parts, keys)
    result = {"output": store.uri, "rows": int(len(table_rows)), "stale_rows": int(len(parts) - len(table_rows)),
              "duplicates": 0, "complete_queries": 0}
    if len(table_rows):
        dup = table_rows.duplicated(["query_id", "model"], keep="last")
        result["duplicates"] = int(dup.sum())  # 0 by construction; reported so a test can hold us to it
        table_rows = table_rows[~dup.to_numpy()]
        per_query = table_rows.groupby("query_id")["model"].nunique()
        complete = per_query.index[per_query == len(model_ids)]
        if len(complete):
            table = RoutingTable(table_rows[table_rows["query_id"].isin(complete)], source=store.path("table"))
            store.write_parquet(table.df, "routing_table.parquet")
            result["complete_queries"] = table.n_queries
        store.write_text("summary.md", summary_markdown(table_rows))
        store.write_text("summary.csv", (100 * table_rows.groupby(["model", "task"])["correct"].mean()).unstack().to_csv())
    errors = current_rows(store.read_parts("errors"), keys)
    if len(errors):
        done = set(zip(table_rows["query_id"], table_rows["model"])) if len(table_rows) else set()
        open_err = errors[[(q, m) not in done for q, m in zip(errors["query_id"], errors["model"])]]
        open_err = open_err.drop_duplicates(["query_id", "model"], keep="last")
    else:
        open_err = errors
    result["open_errors"] = int(len(open_err))
    if len(open_err):
        store.write_parquet(open_err, "errors.parquet")
    else:
        store.delete("errors.parquet")
    log(f"{store.uri}: {result['complete_queries']} complete queries × {len(model_ids)} models, "
        f"{result['open_errors']} open errors")
    return result


def summary_markdown(df: pd.DataFrame) -> str:
    """Model × task accuracy (%) with mean cost per query, as a markdown table (paper Table 2)."""
    acc = (100 * df.groupby(["model", "task"])["correct"].mean()).unstack()
    acc["Avg."] = 100 * df.groupby("model")["correct"].mean()
    acc["$/query"] = df.groupby("model")["cost"].mean()
    head = "| model | " + " | ".join(map(str, acc.columns)) + " |"
    lines = [head, "|" + "---|" * (len(acc.columns) + 1)]
    for m, row in acc.iterrows():
        cells = [f"{v:.2f}" if c != "$/query" else f"{v:.3g}" for c, v in row.items()]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def graded_parts(output) -> pd.DataFrame:
    """Every graded row a job wrote under ``output`` (a folder or a URI): its ``table/`` parts, concatenated, as they
    are (what the drift monitor charges and learns from)."""
    return Store(output).read_parts("table")
