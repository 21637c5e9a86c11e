"""The one cost function: what an answer costs from its token counts and the model's prices per million tokens."""
from __future__ import annotations

import numpy as np


def answer_cost(price, usage, estimate: float | None = None) -> tuple[float | None, bool]:
    """What one answer costs, the one rule budgets, keys and feedback charge by: its ``usage`` tokens at the model's
    ``price`` (a ``Price``) where both are known (metered: True), else the router's ``estimate`` (metered: False;
    None without one)."""
    real = price.cost(usage) if price is not None and usage else None
    return (float(real), True) if real is not None else (estimate, False)


def token_cost(input_tokens, output_tokens, input_per_mtok, output_per_mtok):
    """USD = input tokens × input price + output tokens × output price, prices in USD per million tokens.
    Numbers or arrays (broadcast: e.g. tokens (n, 1) or (n, M) against prices (M,))."""
    return (np.asarray(input_tokens, dtype=np.float64) * np.asarray(input_per_mtok, dtype=np.float64)
            + np.asarray(output_tokens, dtype=np.float64) * np.asarray(output_per_mtok, dtype=np.float64)) / 1e6


def token_bound(body: dict) -> tuple[int, int]:
    """(prompt, completion) tokens an OpenAI request ``body`` can cost at most — the one bound holds and rate limits
    take: its whole body as prompt (messages, tools, schemas, instructions, a Responses conversation's history; a token
    for every 3 characters, more than any tokenizer gives for text) and ``max_tokens`` (``max_completion_tokens``,
    ``max_output_tokens``) for each of its ``n`` (``best_of``) answers."""
    import json

    prompt = len(json.dumps(body, separators=(",", ":"))) // 3
    limit = int(body.get("max_completion_tokens") or body.get("max_tokens") or body.get("max_output_tokens") or 0)
    return prompt, limit * max(int(body.get("n") or 1), int(body.get("best_of") or 1))


def writes_cache(body: dict) -> bool:
    """Whether a request asks its provider to write its prompt to a cache (Anthropic's ``cache_control`` on a block, a
    tool or the request), which bills that prompt above the input price."""
    stack = [body]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if "cache_control" in v:
                return True
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False
