"""proxray: evaluate a pool of LLMs, learn where each is good and cheap, route every query.

Imports are lazy (PEP 562): ``import proxray`` loads nothing heavy; torch, sentence-transformers,
ray and vllm are imported only by the code paths that need them.
"""
from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "RoutingTable": "proxray.table", "TableValidationError": "proxray.table",
    "SentenceEncoder": "proxray.embed", "EmbeddingCache": "proxray.embed",
    "KNNRouter": "proxray.routers", "KMeansRouter": "proxray.routers", "choose": "proxray.routers",
    "proximity_weights": "proxray.weights",
    "RandomRouter": "proxray.baselines", "LargestRouter": "proxray.baselines", "MLPRouter": "proxray.baselines",
    "oracle_choice": "proxray.baselines",
    "ArtifactError": "proxray.artifact",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'proxray' has no attribute {name!r}")
