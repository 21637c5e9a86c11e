"""Query sets for the evaluation job: rows of {query_id, task, prompt, answer, answer_type}.

Sources:
* a local JSONL or parquet file with those columns;
* the embedded synthetic tasks (``synthetic: {n_per_task, seed}``);
* the paper's ten data sets from the Hugging Face Hub, formatted with the paper's zero-shot prompts
  (appendix B.2). ``load_dataset`` is injected so tests read local rows of the same layout.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

ANSWER_TYPES = ("number", "choice", "exact")  # how a reference answer is graded (evaljob.grading)


COLUMNS = ("query_id", "task", "prompt", "answer", "answer_type")
LETTERS = "ABCDEFGHIJ"


def validate_queries(df: pd.DataFrame, source: str = "queries") -> pd.DataFrame:
    """Check the query-set columns; errors name the column, the row and the rule. A row may have no
    reference answer (live traffic): ``answer`` and ``answer_type`` both empty or absent; such rows are
    graded by the job's judge (``grader``)."""
    df = df.copy()
    if "answer" not in df.columns and "answer_type" not in df.columns:  # no reference answers at all
        df["answer"], df["answer_type"] = "", ""
    for c in ("answer", "answer_type"):
        if c in df.columns:
            df[c] = df[c].where(df[c].notna(), "")
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{source}: missing column(s) {', '.join(missing)} (required: {', '.join(COLUMNS)})")
    if len(df) == 0:
        raise ValueError(f"{source}: no queries")
    df = df.reset_index(drop=True).copy()
    for c in COLUMNS:
        bad = df[c].isna() | (df[c].astype(str).str.len() == 0)
        if c in ("answer", "answer_type"):
            bad = bad & (df["answer"].astype(str).str.len() + df["answer_type"].astype(str).str.len() > 0)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{source}: column {c!r} is empty at row {r}" + (
                "; rule: a reference answer needs both answer and answer_type (leave both empty to have the "
                "job's judge grade the row)" if c in ("answer", "answer_type") else ""))
        df[c] = df[c].astype(str)
    wrong = ~df["answer_type"].isin(ANSWER_TYPES) & (df["answer_type"] != "")
    if wrong.any():
        r = int(np.flatnonzero(wrong)[0])
        raise ValueError(f"{source}: column 'answer_type' is {df.answer_type[r]!r} at row {r}; "
                         f"allowed: {', '.join(ANSWER_TYPES)} (or empty, with no answer, for judge grading)")
    dup = df["query_id"].duplicated()
    if dup.any():
        r = int(np.flatnonzero(dup)[0])
        raise ValueError(f"{source}: column 'query_id' repeats {df.query_id[r]!r} at row {r}; rule: unique ids")
    return df


def read_queries(path) -> pd.DataFrame:
    """A query file (.jsonl or .parquet), local or at a filesystem URI (``proxray.common.storage``)."""
    import io
    from urllib.parse import urlsplit

    from proxray.common.storage import read_file

    suffix = Path(urlsplit(str(path)).path).suffix.lower()
    if suffix not in (".parquet", ".pq", ".jsonl", ".json"):
        raise ValueError(f"{path}: query files are .jsonl or .parquet")
    data = io.BytesIO(read_file(path))
    df = pd.read_parquet(data) if suffix in (".parquet", ".pq") else pd.read_json(data, lines=True, dtype=False)
    return validate_queries(df, str(path))


def synthetic_queries(n_per_task: int = 20, seed: int = 0, tasks=None) -> pd.DataFrame:
    """The synthetic tasks (keeps their ``difficulty`` column for the sim engine)."""
    from proxray.data.synthetic import generate_queries

    return generate_queries(n_per_task, seed, tasks)


# ---- the paper's ten data sets: Hub location and zero-shot prompt (appendix B.2) ---------------
MATH = "Solve the following math problem and provide a numerical answer.\nQuestion: {q}\nGive only the final answer without explanation.\nAnswer:"
MCQ = "Please answer with the correct option letter.\nQuestion: {q}\nChoices:\n{choices}\nReturn only the correct option letter in parenthesis () without any explanation.\nAnswer:"
MCQ_CTX = ("Please answer with the correct option letter based on the given context.\nContext: {c}\nQuestion: {q}\n"
           "Choices:\n{choices}\nReturn only the correct option letter in parenthesis () without any explanation.\nAnswer:")


def _choices(options) -> str:
    return "\n".join(f"({LETTERS[i]}) {o}" for i, o in enumerate(options))


def _svamp(r):
    return MATH.format(q=f"{r['Body'].strip()} {r['Question'].strip()}"), str(r["Answer"]), "number"


def _gsm8k(r):
    return MATH.format(q=r["question"]), r["answer"].split("####")[-1].strip().replace(",", ""), "number"


def _hellaswag(r):
    p = ("Find the most likely ending of the given question.\nQuestion: " + r["ctx"] + "\nChoices:\n"
         + "\n".join(f"Option ({LETTERS[i]}): {e}" for i, e in enumerate(r["endings"]))
         + "\nReturn the correct option letter in parenthesis () without any explanation:")
    return p, LETTERS[int(r["label"])], "choice"


def _sciq(r, rng):
    opts = [r["correct_answer"], r["distractor1"], r["distractor2"], r["distractor3"]]
    perm = rng.permutation(4)
    return MCQ.format(q=r["question"], choices=_choices([opts[j] for j in perm])), LETTERS[int(np.flatnonzero(perm == 0)[0])], "choice"


def _social(r):
    return (MCQ_CTX.format(c=r["context"], q=r["question"], choices=_choices([r["answerA"], r["answerB"], r["answerC"]])),
            LETTERS[int(r["label"]) - 1], "choice")


def _winogrande(r):
    p = ("Choose the correct option letter that fills in the underscore blank in the question.\nQuestion: "
         f"{r['sentence']}\nChoices:\n{_choices([r['option1'], r['option2']])}\n"
         "Return only the letter corresponding to the correct option in parenthesis () without any explanation.\nAnswer:")
    return p, LETTERS[int(r["answer"]) - 1], "choice"


def _medqa(r):
    keys = sorted(r["options"])
    return MCQ.format(q=r["question"], choices=_choices([r["options"][k] for k in keys])), str(r["answer_idx"]), "choice"


def _csqa(r):
    return MCQ.format(q=r["question"], choices=_choices(r["choices"]["text"])), r["answerKey"], "choice"


def _logiqa(r):
    return (MCQ_CTX.format(c=r["context"], q=r["query"], choices=_choices(r["options"])),
            LETTERS[int(r["correct_option"])], "choice")


def _bbh_bool(r):
    p = ("Choose the correct option letter corresponding to the boolean value of the question.\nQuestion: "
         f"{r['input']}\nChoices:\n(A) True\n(B) False\nReturn only the correct option letter in parenthesis () without any explanation.\nAnswer:")
    return p, "A" if r["target"].strip() == "True" else "B", "choice"


HF_TASKS = {
    # task: (dataset id, config, default split, formatter, needs rng)
    "svamp": ("ChilleD/SVAMP", None, "test", _svamp, False),
    "gsm8k": ("openai/gsm8k", "main", "test", _gsm8k, False),
    "hellaswag": ("Rowan/hellaswag", None, "validation", _hellaswag, False),
    "sciq": ("allenai/sciq", None, "test", _sciq, True),
    "social_iqa": ("allenai/social_i_qa", None, "validation", _social, False),
    "winogrande": ("allenai/winogrande", "winogrande_xl", "validation", _winogrande, False),
    "medqa": ("GBaker/MedQA-USMLE-4-options", None, "test", _medqa, False),
    "commonsense_qa": ("tau/commonsense_qa", None, "validation", _csqa, False),
    "logiqa": ("lucasmccabe/logiqa", None, "test", _logiqa, False),
    "bbh_boolean_expressions": ("lukaemon/bbh", "boolean_expressions", "test", _bbh_bool, False),
}


def hf_queries(task: str, split: str | None = None, n: int | None = None, seed: int = 42, load_dataset=None) -> pd.DataFrame:
    """One of the paper's data sets from the Hub, as query rows with the paper's zero-shot prompt.
    ``n`` queries are drawn with ``seed`` (all if None)."""
    if task not in HF_TASKS:
        raise ValueError(f"hf task {task!r}: known tasks are {', '.join(HF_TASKS)}")
    name, config, default_split, fmt, needs_rng = HF_TASKS[task]
    if load_dataset is None:
        from datasets import load_dataset
    ds = load_dataset(name, config, split=split or default_split) if config else load_dataset(name, split=split or default_split)
    rows = list(ds)
    rng = np.random.default_rng([seed, int(hashlib.sha256(task.encode()).hexdigest()[:8], 16)])
    keep = range(len(rows)) if n is None or n >= len(rows) else sorted(rng.choice(len(rows), n, replace=False))
    out = []
    for i in keep:  # ids carry the row's position in the split, so they do not depend on n
        prompt, answer, kind = fmt(rows[i], rng) if needs_rng else fmt(rows[i])
        out.append((f"{task}-{split or default_split}-{i}", task, prompt, answer, kind))
    return validate_queries(pd.DataFrame(out, columns=list(COLUMNS)), f"hf:{name}")
