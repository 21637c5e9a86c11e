"""Grading model answers: numbers (math), option letters (multiple choice), exact match.

Model outputs are messy ("The answer is **42**.", "(B) Patricia", "Answer: b) because…"), so each
extractor looks for the most explicit statement first and falls back to weaker evidence.
``grade(response, answer, answer_type) -> float in {0, 1}``.
"""
from __future__ import annotations

import re

from proxray.data.querysets import ANSWER_TYPES

_NUM = r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?"
_FINAL_PATTERNS = [
    re.compile(r"####\s*(" + _NUM + ")"),
    re.compile(r"\\boxed\{\s*\$?(" + _NUM + r")\s*\}"),
    re.compile(r"(?:final answer|the answer is|answer is|answer:)\s*[:=]?\s*\**\s*\$?\s*(" + _NUM + ")", re.I),
]


def _to_float(s: str) -> float | None:
    s = s.replace(",", "").rstrip(".")
    try:
        if "/" in s:
            a, b = s.split("/", 1)
            return float(a) / float(b)
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def extract_number(text: str) -> float | None:
    """The final numeric answer in ``text`` (an explicit "answer is …" first, else the last number)."""
    if not isinstance(text, str):
        return None
    for pat in _FINAL_PATTERNS:
        hits = pat.findall(text)
        if hits:
            return _to_float(hits[-1])
    nums = re.findall(_NUM, text)
    return _to_float(nums[-1]) if nums else None


_CHOICE_PATTERNS = [
    re.compile(r"(?:answer|option|choice)\s*(?:is|:)?\s*\(?\**\s*\(?([A-J])\)?(?![A-Za-z])", re.I),
    re.compile(r"^\s*\(?\**\s*([A-J])\s*[\).:\]]", re.M),
    re.compile(r"\(([A-J])\)"),
    re.compile(r"^\s*\**([A-J])\**\s*$", re.M),
]


def extract_choice(text: str, n_options: int = 10) -> str | None:
    """The option letter a response commits to, upper case, or None."""
    if not isinstance(text, str):
        return None
    allowed = "ABCDEFGHIJ"[:n_options]
    for pat in _CHOICE_PATTERNS:
        for m in pat.finditer(text):
            letter = m.group(1).upper()
            if letter in allowed:
                return letter
    stripped = text.strip().strip("*").strip()
    return stripped.upper() if len(stripped) == 1 and stripped.upper() in allowed else None


def normalize_text(s: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", "", str(s).lower())).strip()


def grade(response: str, answer: str, answer_type: str) -> float:
    """1.0 if ``response`` answers ``answer`` correctly under ``answer_type``, else 0.0."""
    if answer_type == "number":
        got, want = extract_number(response), _to_float(str(answer))
        return float(got is not None and want is not None and abs(got - want) <= 1e-6 * max(1.0, abs(want)))
    if answer_type == "choice":
        return float(extract_choice(response) == str(answer).strip().strip("()").upper())
    if answer_type == "exact":
        r, a = normalize_text(response), normalize_text(answer)
        return float(r == a or (len(a) > 0 and re.search(rf"\b{re.escape(a)}\b", r) is not None
                                and len(r.split()) <= 4 * max(1, len(a.split()))))
    raise ValueError(f"answer_type={answer_type!r}: allowed values are {', '.join(ANSWER_TYPES)}")


_SCORE = re.compile(r"score\s*(?:is|[:=])?\s*\**\s*(\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?", re.I)


def parse_score(text) -> float | None:
    """A judge's score in [0, 1] from its output: the last ``Score: X`` (X in [0, 1], or ``X/N``), else a
    reply that is only a number in [0, 1]; None when there is no such score."""
    if not isinstance(text, str):
        return None
    hits = _SCORE.findall(text)
    if hits:
        num, den = hits[-1]
        v = float(num) / float(den) if den and float(den) > 0 else float(num)
        return v if 0.0 <= v <= 1.0 else None
    bare = text.strip().strip("*.").strip()
    try:
        v = float(bare)
    except ValueError:
        return None
    return v if 0.0 <= v <= 1.0 else None
