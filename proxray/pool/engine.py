"""What every engine is: the ``Engine`` interface the evaluation job and the served model deployments call, and
the ``Finish`` that ends a streamed answer.

``engine.generate(rows, sampling) -> list of {"response", "input_tokens", "output_tokens"}`` for rows that carry
at least ``query_id``, ``task``, ``prompt``, ``answer``, ``answer_type`` (the job);
``engine.stream(messages, prompt, sampling, stop)`` yields the answer's pieces and ends with a ``Finish``
(serving). ``sampling`` is the one sampling spec, ``proxray.pool.spec.Sampling``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from proxray.pool.spec import Sampling


@dataclass(frozen=True)
class Finish:
    """The end of one streamed generation: token counts and why it ended (``stop`` or ``length``)."""
    input_tokens: int
    output_tokens: int
    reason: str


class Engine(Protocol):
    """What every in-process engine does: answer a batch for the job, stream one answer when served."""

    def generate(self, rows, sampling: Sampling = ...) -> list: ...

    def stream(self, messages, prompt, sampling: Sampling = ..., stop=()): ...


def cut_at_stop(text: str, stop) -> int:
    """Index of the first stop string in ``text``, or -1."""
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(hits) if hits else -1
