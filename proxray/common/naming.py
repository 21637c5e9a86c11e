"""The one way a model id becomes a name: output folders of the evaluation job, Serve deployment names."""
from __future__ import annotations

import hashlib
import re


def slug(model_id: str) -> str:
    """A file- and deployment-name-safe name for a model id, injective: the readable part plus a short
    hash of the id itself, so ``a:fp16`` and ``a@fp16`` get different names."""
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", model_id.replace("/", "__"))[:80]
    return f"{readable}-{hashlib.sha256(model_id.encode()).hexdigest()[:8]}"
