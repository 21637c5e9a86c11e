"""The routing table: one row per (query, model) with the observed correctness and cost.

Canonical long form (docs/guides/routing-tables.md):

    query_id str | task str | prompt str | model str | correct float in [0, 1]
    cost float >= 0 (optional) | split str (optional) | response str (optional)
    input_tokens int >= 0 (optional) | output_tokens int >= 0 (optional)

``RoutingTable`` validates a table at the boundary (every problem is reported with its column, row
and rule), applies an explicit policy to queries that lack some models, and gives the wide view the
routers learn from: ``acc, cost = table.matrices()``, each (n_queries, n_models), rows in
``table.query_ids`` order, columns in ``table.models`` order.
"""
from __future__ import annotations

import io

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from proxray.common.memory import check_memory

REQUIRED = ("query_id", "task", "prompt", "model", "correct")
OPTIONAL = ("cost", "split", "response", "input_tokens", "output_tokens", "grader", "judge_cost")
STRING_COLUMNS = ("query_id", "task", "prompt", "model", "split", "response", "grader")
FORMATS = ("parquet", "csv", "jsonl")
MISSING_POLICIES = ("drop", "error")
MAX_REPORTED = 10


class TableValidationError(ValueError):
    """A routing table broke a rule. ``problems`` lists every message (column, row, rule)."""

    def __init__(self, problems: list[str], source: str = "table"):
        self.problems = problems
        shown = problems[:MAX_REPORTED]
        more = f"\n  … and {len(problems) - MAX_REPORTED} more" if len(problems) > MAX_REPORTED else ""
        super().__init__(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(shown) + more)


@dataclass
class ValidationReport:
    """What validation changed: queries dropped by the missing-models policy, and why."""

    n_rows: int = 0
    dropped_queries: dict = field(default_factory=dict)  # query_id -> list of missing models

    def __str__(self):
        if not self.dropped_queries:
            return f"{self.n_rows} rows, nothing dropped"
        ex = ", ".join(f"{q} (missing {', '.join(m[:3])}{'…' if len(m) > 3 else ''})"
                       for q, m in list(self.dropped_queries.items())[:3])
        return f"{self.n_rows} rows; dropped {len(self.dropped_queries)} queries missing some models: {ex}"


def _rows(mask) -> list[int]:
    return np.flatnonzero(np.asarray(mask)).tolist()


def _describe_rows(rows, df, col) -> str:
    def show(v):
        return repr(v.item() if isinstance(v, np.generic) else v)

    vals = ", ".join(f"row {r} ({show(df[col].iloc[r])})" for r in rows[:3])
    return vals + (f" and {len(rows) - 3} more" if len(rows) > 3 else "")


def validate_frame(df: pd.DataFrame, missing: str = "drop", source: str = "table"):
    """Check every rule; return (clean frame, ValidationReport) or raise TableValidationError."""
    if missing not in MISSING_POLICIES:
        raise ValueError(f"missing={missing!r}: allowed values are {', '.join(MISSING_POLICIES)}")
    if len(df) == 0:
        raise TableValidationError(["the table is empty: at least one (query, model) row is required"], source)
    absent = [c for c in REQUIRED if c not in df.columns]
    if absent:
        raise TableValidationError([f"missing required column(s) {', '.join(absent)} "
                                    f"(required: {', '.join(REQUIRED)}; optional: {', '.join(OPTIONAL)})"], source)
    df = df.reset_index(drop=True)
    problems: list[str] = []
    out = pd.DataFrame(index=df.index)

    for col in [c for c in STRING_COLUMNS if c in df.columns]:
        s = df[col]
        null = s.isna().to_numpy()
        if col in REQUIRED and null.any():
            problems.append(f"column {col!r}: empty value at {_describe_rows(_rows(null), df, col)}; rule: required")
        bad = ~null & ~s.map(lambda v: isinstance(v, str)).to_numpy()
        if bad.any():
            problems.append(f"column {col!r}: not a string at {_describe_rows(_rows(bad), df, col)}; rule: type str")
        out[col] = s.astype("object").where(~null, None) if col not in REQUIRED else s.astype("object")

    def numeric(col):
        s = df[col]
        num = pd.to_numeric(s, errors="coerce").astype(np.float64)
        bad = (num.isna() & s.notna()).to_numpy()
        if bad.any():
            problems.append(f"column {col!r}: not a number at {_describe_rows(_rows(bad), df, col)}; rule: type float")
        return num, bad

    corr, bad = numeric("correct")
    nan = corr.isna().to_numpy() & ~bad
    if nan.any():
        problems.append(f"column 'correct': missing or NaN at {_describe_rows(_rows(nan), df, 'correct')}; rule: required")
    out_range = ((corr < 0) | (corr > 1)).to_numpy()
    if out_range.any():
        problems.append(f"column 'correct': outside [0, 1] at {_describe_rows(_rows(out_range), df, 'correct')}; "
                        "rule: 0 <= correct <= 1")
    out["correct"] = corr

    if "cost" in df.columns and df["cost"].notna().any():  # an all-empty cost column means "no cost"
        cost, bad = numeric("cost")
        nan = cost.isna().to_numpy() & ~bad
        if nan.any():
            problems.append(f"column 'cost': NaN at {_describe_rows(_rows(nan), df, 'cost')}; "
                            "rule: cost is given for every row or for none")
        inf = np.isinf(cost.to_numpy())
        if inf.any():
            problems.append(f"column 'cost': infinite at {_describe_rows(_rows(inf), df, 'cost')}; rule: finite")
        neg = (cost < 0).to_numpy()
        if neg.any():
            problems.append(f"column 'cost': negative at {_describe_rows(_rows(neg), df, 'cost')}; rule: cost >= 0")
        out["cost"] = cost

    for col in ("input_tokens", "output_tokens"):
        if col in df.columns and df[col].notna().any():
            tok, bad = numeric(col)
            wrong = (tok.notna() & ((tok < 0) | (tok != np.floor(tok)))).to_numpy()
            if wrong.any():
                problems.append(f"column {col!r}: not a whole number >= 0 at {_describe_rows(_rows(wrong), df, col)}; "
                                "rule: integer >= 0")
            out[col] = tok.astype("Int64") if not (bad.any() or wrong.any()) else tok

    if "judge_cost" in df.columns and df["judge_cost"].notna().any():  # USD the judge spent grading the row
        jc, bad = numeric("judge_cost")
        neg = (jc < 0).to_numpy() | np.isinf(jc.to_numpy())
        if neg.any():
            problems.append(f"column 'judge_cost': negative or infinite at {_describe_rows(_rows(neg), df, 'judge_cost')}; "
                            "rule: 0 <= judge_cost < inf")
        out["judge_cost"] = jc

    if not problems:
        dup = out.duplicated(["query_id", "model"], keep="first").to_numpy()
        if dup.any():
            ex = ", ".join(f"row {r} ({out.query_id[r]!r}, {out.model[r]!r})" for r in _rows(dup)[:3])
            problems.append(f"columns ('query_id', 'model'): duplicate pair at {ex}; rule: one row per query and model")
        for col in ("task", "prompt"):
            n = out.groupby("query_id", sort=False)[col].nunique()
            if (n > 1).any():
                q = n.index[n > 1][0]
                problems.append(f"column {col!r}: query_id {q!r} has {int(n[q])} different values; "
                                f"rule: one {col} per query")
    if problems:
        raise TableValidationError(problems, source)

    report = ValidationReport(n_rows=len(out))
    models = sorted(out["model"].unique())
    per_query = out.groupby("query_id", sort=False)["model"].agg(set)
    incomplete = per_query[per_query.map(len) < len(models)]
    if len(incomplete):
        missing_of = {q: sorted(set(models) - s) for q, s in incomplete.items()}
        if missing == "error":
            ex = "; ".join(f"{q!r} lacks {', '.join(m)}" for q, m in list(missing_of.items())[:3])
            raise TableValidationError([f"{len(missing_of)} queries lack results for some models ({ex}); "
                                        "rule: every query has every model (use missing='drop' to drop them)"], source)
        report.dropped_queries = missing_of
        out = out[~out["query_id"].isin(missing_of)].reset_index(drop=True)
        if len(out) == 0:
            raise TableValidationError(["no query has results for every model: nothing left after dropping"], source)
    return out, report


READ_BYTES_PER_ROW, READ_PER_DATA_BYTE, READ_PER_TEXT_BYTE = 2560, 4, 8  # measured on the shared tables, rounded up


def read_memory(source, fmt: str) -> int:
    """Bytes reading a table and building its matrices takes at its peak, estimated before reading it: from a
    parquet file's metadata (rows, uncompressed size), or from a CSV / JSONL file's size. The shared tables
    peaked at 2.2-3.3 kB a long row (including pandas' own objects); the estimate is set above them."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(source).metadata
        if isinstance(source, io.BytesIO):
            source.seek(0)
        data = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        return meta.num_rows * READ_BYTES_PER_ROW + READ_PER_DATA_BYTE * data
    size = source.getbuffer().nbytes if isinstance(source, io.BytesIO) else Path(source).stat().st_size
    return READ_PER_TEXT_BYTE * size


def _format_of(location, format: str | None) -> str:
    suffix = Path(urlsplit(str(location)).path).suffix.lower()
    fmt = format or {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl",
                     ".json": "jsonl"}.get(suffix)
    if fmt not in FORMATS:
        raise ValueError(f"{location}: cannot tell the format from the suffix {suffix!r}; "
                         f"pass format= one of {', '.join(FORMATS)}")
    return fmt


class RoutingTable:
    """A validated routing table (long form) with its wide (n_queries, n_models) view."""

    def __init__(self, df: pd.DataFrame, missing: str = "drop", source: str = "table"):
        self.df, self.report = validate_frame(df, missing=missing, source=source)
        codes, self._query_ids = pd.factorize(self.df["query_id"], sort=False)
        self._qcodes = codes
        self.models: list[str] = sorted(self.df["model"].unique())
        first = self.df.drop_duplicates("query_id", keep="first")
        self.prompts: list[str] = first["prompt"].tolist()
        self.tasks: np.ndarray = first["task"].to_numpy(dtype=object)
        self.splits = first["split"].to_numpy(dtype=object) if "split" in self.df else None

    # ---- io --------------------------------------------------------------------------------
    @classmethod
    def read(cls, path, format: str | None = None, missing: str = "drop") -> "RoutingTable":
        """Read parquet, CSV or JSONL (by suffix, or ``format=``) from a local path or a filesystem URI
        (``s3://bucket/t.parquet``, ``gs://…``, ``file://…``: ``proxray.common.storage``)."""
        from proxray.common.storage import is_uri

        fmt = _format_of(path, format)
        if is_uri(path):
            from proxray.common.storage import check_location, read_file

            check_location(path, "routing table", file=True)
            source = io.BytesIO(read_file(path))
        else:
            source = Path(path)
            if not source.exists():
                raise FileNotFoundError(f"{source}: no such routing table")
        check_memory(read_memory(source, fmt), f"reading the routing table {path}",
                     "split it (e.g. by task) and fit or evaluate a part, or use a machine with more memory")
        if fmt == "parquet":
            df = pd.read_parquet(source)
        elif fmt == "csv":
            df = pd.read_csv(source, dtype={c: "object" for c in STRING_COLUMNS}, keep_default_na=False,
                             na_values={"correct": [""], "cost": [""], "input_tokens": [""], "output_tokens": [""]})
            for c in ("split", "response"):
                if c in df:
                    df[c] = df[c].replace("", None)
        else:
            df = pd.read_json(source, lines=True, dtype={c: "object" for c in STRING_COLUMNS})
        return cls(df, missing=missing, source=str(path))

    def write(self, path, format: str | None = None):
        """Write the long table as parquet, CSV or JSONL (by suffix, or ``format=``) to a local path or a filesystem
        URI, atomically: locally into a temporary file beside ``path``, renamed over it when complete; on an object
        store in one PUT. Returns where it went (a ``Path``, or the URI)."""
        from proxray.common.storage import is_uri, replace_atomically

        fmt = _format_of(path, format)
        if fmt == "parquet":
            buf = io.BytesIO()
            self.df.to_parquet(buf, index=False)
            data = buf.getvalue()
        elif fmt == "csv":
            data = self.df.to_csv(index=False).encode()
        else:
            data = self.df.to_json(orient="records", lines=True, force_ascii=False).encode()
        if is_uri(path):
            from proxray.common.storage import write_file

            return write_file(path, data)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(path, data)
        return path

    # ---- views -----------------------------------------------------------------------------
    @property
    def query_ids(self) -> list[str]:
        return list(self._query_ids)

    @property
    def n_queries(self) -> int:
        return len(self._query_ids)

    @property
    def has_cost(self) -> bool:
        return "cost" in self.df.columns

    def matrices(self, models: list[str] | None = None):
        """(acc, cost): float64 arrays (n_queries, n_models); cost is None for a table without cost.

        Rows follow ``query_ids``; columns follow ``models`` (default ``self.models``, sorted by name).
        """
        models = self.models if models is None else list(models)
        unknown = [m for m in models if m not in self.models]
        if unknown:
            raise KeyError(f"models not in the table: {unknown}")
        col = pd.Index(models).get_indexer(self.df["model"])
        keep = col >= 0
        rows, col = self._qcodes[keep], col[keep]
        acc = np.full((self.n_queries, len(models)), np.nan)
        acc[rows, col] = self.df["correct"].to_numpy()[keep]
        cost = None
        if self.has_cost:
            cost = np.full_like(acc, np.nan)
            cost[rows, col] = self.df["cost"].to_numpy()[keep]
        return acc, cost

    def summary(self) -> pd.DataFrame:
        """Model × task table of mean accuracy (%) and, with cost, mean cost per query (USD)."""
        g = self.df.groupby(["model", "task"])
        out = {"accuracy_%": (100 * g["correct"].mean()).unstack()}
        if self.has_cost:
            out["cost_usd"] = g["cost"].mean().unstack()
        return pd.concat(out, axis=1)

    def subset(self, query_ids) -> "RoutingTable":
        keep = set(query_ids)
        return RoutingTable(self.df[self.df["query_id"].isin(keep)], source="subset")

    def append(self, other: "RoutingTable | pd.DataFrame", missing: str = "drop") -> "RoutingTable":
        """A new table with ``other``'s rows added: a new model's results over these queries, new
        queries, or both. A (query_id, model) pair present in both is refused, not overwritten."""
        other_df = other.df if isinstance(other, RoutingTable) else other
        both = pd.concat([self.df, other_df], ignore_index=True)
        return RoutingTable(both, missing=missing, source="appended table")

    @classmethod
    def from_matrices(cls, acc, cost=None, models=None, prompts=None, tasks=None, query_ids=None, split=None):
        """Build the long table from (n, M) matrices (the inverse of ``matrices``)."""
        acc = np.asarray(acc, dtype=np.float64)
        n, M = acc.shape
        models = [f"model_{j}" for j in range(M)] if models is None else list(models)
        query_ids = [f"q{i}" for i in range(n)] if query_ids is None else list(query_ids)
        prompts = [f"query {i}" for i in range(n)] if prompts is None else list(prompts)
        tasks = ["task"] * n if tasks is None else list(tasks)
        df = pd.DataFrame({
            "query_id": np.repeat(query_ids, M), "task": np.repeat(tasks, M), "prompt": np.repeat(prompts, M),
            "model": np.tile(models, n), "correct": acc.reshape(-1)})
        if cost is not None:
            df["cost"] = np.asarray(cost, dtype=np.float64).reshape(-1)
        if split is not None:
            df["split"] = np.repeat(list(split), M)
        return cls(df, source="matrices")

    def __repr__(self):
        return (f"RoutingTable({self.n_queries} queries × {len(self.models)} models, "
                f"{len(set(self.tasks))} tasks, cost={'yes' if self.has_cost else 'no'})")
