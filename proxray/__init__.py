"""proxray: evaluate a pool of LLMs, learn where each is good and cheap, route every query.

Imports are lazy (PEP 562): ``import proxray`` loads nothing heavy; torch, sentence-transformers,
ray and vllm are imported only by the code paths that need them.
"""
from proxray.common.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "RoutingTable": "proxray.data.table", "TableValidationError": "proxray.data.table",
    "SentenceEncoder": "proxray.embeddings.encoder", "EmbeddingCache": "proxray.embeddings.cache",
    "KNNRouter": "proxray.routing.knn", "KMeansRouter": "proxray.routing.kmeans", "choose": "proxray.routing.objective",
    "proximity_weights": "proxray.routing.weights",
    "RandomRouter": "proxray.routing.baselines", "LargestRouter": "proxray.routing.baselines", "MLPRouter": "proxray.routing.baselines",
    "oracle_choice": "proxray.routing.baselines",
    "ArtifactError": "proxray.routing.artifact",
}
__all__ = sorted(_EXPORTS) + ["__version__"]
__getattr__ = lazy_exports(__name__, _EXPORTS)
