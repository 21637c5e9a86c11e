"""Importers from public routing-data formats into the canonical long table.

* RouterBench's wide layout (withmartian/routerbench, and RouterDC's re-split of it): one row per
  query with ``sample_id``, ``prompt``, ``eval_name``, one correctness column per model and
  ``<model>|total_cost`` / ``<model>|model_response`` columns; as CSV or as the dataset's pickle.
* RouterDC's JSON: a list of ``{"question": str, "scores": {model: score}}`` per task file.
* The Hugging Face dataset ``withmartian/routerbench`` (download through ``huggingface_hub``).

Missing cells (a model without a result for a query) are left out of the long table; the
``RoutingTable`` missing-models policy then decides what happens to that query.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from proxray.data.table import RoutingTable

ROUTERBENCH_META = {"sample_id", "prompt", "eval_name", "oracle_model_to_route_to", "Unnamed: 0", "index"}
_SPLIT_RE = re.compile(r"[_\-.](train|test|dev|val|valid|validation)$", re.IGNORECASE)


def split_from_name(stem: str) -> tuple[str, str]:
    """'gsm8k-train' -> ('gsm8k', 'train'); 'ceval' -> ('ceval', 'all')."""
    m = _SPLIT_RE.search(stem)
    return (stem[: m.start()], m.group(1).lower()) if m else (stem, "all")


def strip_few_shot(prompt) -> str:
    """The query itself, without few-shot exemplars: RouterBench stores the prompt as a Python list
    literal of turns whose last turn ends with the actual question after the last blank line."""
    if isinstance(prompt, str) and prompt.startswith("[") and prompt.endswith("]"):
        try:
            prompt = ast.literal_eval(prompt)  # literals only: no code is evaluated
        except (ValueError, SyntaxError):
            pass
    if isinstance(prompt, (list, tuple, np.ndarray)):
        prompt = str(prompt[-1]) if len(prompt) else ""
    blocks = [b for b in str(prompt).split("\n\n") if b.strip()]
    return blocks[-1].strip() if blocks else str(prompt).strip()


def routerbench_frame(wide: pd.DataFrame, split: str | None = None, few_shot: bool = False) -> pd.DataFrame:
    """Long canonical frame from a RouterBench wide frame (missing cells left out)."""
    absent = [c for c in ("sample_id", "prompt", "eval_name") if c not in wide.columns]
    if absent:
        raise ValueError(f"not a RouterBench wide table: missing column(s) {', '.join(absent)}")
    models = [c for c in wide.columns if "|" not in c and c not in ROUTERBENCH_META]
    if not models:
        raise ValueError("not a RouterBench wide table: no model correctness columns")
    prompts = wide["prompt"].map(lambda p: str(p) if few_shot else strip_few_shot(p))
    parts = []
    for m in models:
        part = pd.DataFrame({"query_id": wide["sample_id"].astype(str), "task": wide["eval_name"].astype(str),
                             "prompt": prompts, "model": m, "correct": pd.to_numeric(wide[m], errors="coerce")})
        if f"{m}|total_cost" in wide:
            part["cost"] = pd.to_numeric(wide[f"{m}|total_cost"], errors="coerce")
        if split is not None:
            part["split"] = split
        if f"{m}|model_response" in wide:
            part["response"] = wide[f"{m}|model_response"].map(lambda v: None if pd.isna(v) else str(v))
        keep = part["correct"].notna()
        if "cost" in part:
            keep &= part["cost"].notna()
        parts.append(part[keep])
    return pd.concat(parts, ignore_index=True)


def read_routerbench(paths, split: str | None = None, missing: str = "drop", few_shot: bool = False,
                     trust_pickle: bool = False) -> RoutingTable:
    """RouterBench wide files (``.csv`` or ``.pkl``) -> RoutingTable. The split is taken from each file
    name (``arc_challenge_train.csv`` -> train) unless ``split`` is given.

    ``.pkl`` is the format withmartian/routerbench publishes; unpickling runs arbitrary code, so a pickle
    is read only with ``trust_pickle=True`` (``--trust-pickle`` on the command line).
    """
    frames = []
    for path in [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]:
        if path.suffix.lower() in (".pkl", ".pickle"):
            if not trust_pickle:
                raise ValueError(f"{path}: refusing to unpickle (it can run code); pass trust_pickle=True "
                                 "(--trust-pickle) for a file from a source you trust, or convert it to CSV")
            wide = pd.read_pickle(path)
        else:
            wide = pd.read_csv(path)
        frames.append(routerbench_frame(wide, split or split_from_name(path.stem)[1], few_shot))
    return RoutingTable(pd.concat(frames, ignore_index=True), missing=missing, source="routerbench import")


def read_routerdc(paths, missing: str = "drop") -> RoutingTable:
    """RouterDC JSON task files -> RoutingTable. Task and split come from the file name
    (``gsm8k-train.json`` -> task gsm8k, split train; ``ceval.json`` -> split all); query ids are
    ``<file stem>-<position>``. RouterDC has no cost."""
    rows = []
    for path in [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]:
        items = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(items, list):
            raise ValueError(f"{path}: expected a JSON list of {{question, scores}} objects")
        task, split = split_from_name(path.stem)
        for i, item in enumerate(items):
            if not isinstance(item, dict) or "question" not in item or not isinstance(item.get("scores"), dict):
                raise ValueError(f"{path}: item {i} is not an object with 'question' and 'scores'")
            for model, score in item["scores"].items():
                rows.append((f"{path.stem}-{i}", task.lower(), item["question"], model, score, split))
    df = pd.DataFrame(rows, columns=["query_id", "task", "prompt", "model", "correct", "split"])
    return RoutingTable(df, missing=missing, source="routerdc import")


def load_routerbench_hf(filename: str = "routerbench_0shot.pkl", repo_id: str = "withmartian/routerbench",
                        revision: str | None = None, missing: str = "drop", download=None,
                        trust_pickle: bool = False) -> RoutingTable:
    """Download a RouterBench file from the Hugging Face Hub and import it.

    ``download(repo_id, filename, revision) -> local path`` defaults to ``huggingface_hub``'s
    ``hf_hub_download`` (cached, honours ``HF_HUB_OFFLINE``); pass another to read from elsewhere.
    """
    if download is None:
        def download(repo_id, filename, revision):
            from huggingface_hub import hf_hub_download

            return hf_hub_download(repo_id=repo_id, filename=filename, revision=revision, repo_type="dataset")
    local = Path(download(repo_id, filename, revision))
    return read_routerbench([local], split="all", missing=missing, trust_pickle=trust_pickle)
