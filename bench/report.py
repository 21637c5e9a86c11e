"""A benchmark's result: printed as one JSON line, and written (indented) where ``--json`` says."""
from __future__ import annotations

import json
from pathlib import Path


def emit(res: dict, path: str | None) -> None:
    print(json.dumps(res))
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(res, indent=2))
