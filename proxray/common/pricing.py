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
