"""Where embeddings are kept: ``EmbeddingCache`` on disk (SQLite, one row per (encoder id, sha256 of text)), so
experiments encode every text once across runs, and ``LRUEmbeddings``, the bounded in-memory cache of a serving
replica. ``default_cache_dir`` is proxray's cache folder (``PROXRAY_CACHE``), which also holds the encoders made
from a source model (the ONNX export, the static encoder): ``source_fingerprint`` keys them on the source's content,
``build_folder_once`` writes each whole."""
from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import numpy as np

from proxray.common.lru import LRU


def default_cache_dir() -> Path:
    return Path(os.environ.get("PROXRAY_CACHE", Path.home() / ".cache" / "proxray"))


def source_fingerprint(source: str) -> str:
    """sha256 over a local folder's file names, sizes and contents of its config/tokenizer files and the
    weights' size and first/last MiB (fast, changes with any re-saved weights); a Hub name is its own key."""
    p = Path(source)
    if not p.is_dir():
        return hashlib.sha256(source.encode()).hexdigest()
    h = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file()):
        h.update(str(f.relative_to(p)).encode())
        size = f.stat().st_size
        h.update(str(size).encode())
        with open(f, "rb") as fh:
            if size <= 4 << 20:
                h.update(fh.read())
            else:
                h.update(fh.read(1 << 20))
                fh.seek(size - (1 << 20))
                h.update(fh.read())
    return h.hexdigest()


def build_folder_once(final: Path, build, prefix: str) -> Path:
    """``final`` (a cache folder whose ``meta.json`` marks it complete), made by ``build(tmp)`` into a temporary
    folder beside it and renamed into place whole: concurrent processes race safely, the first rename wins."""
    final = Path(final)
    if (final / "meta.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=prefix))
    try:
        build(tmp)
        try:
            os.rename(tmp, final)  # atomic; fails if another process got there first
        except OSError:
            if not (final / "meta.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


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


class LRUEmbeddings:
    """At most ``capacity`` vectors keyed by sha256 of their text, least recently used evicted first
    (a 384-d float32 vector and its key take ~1.7 KB: 10,000 entries ~17 MB)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._d = LRU(capacity)
        self.hits = self.misses = 0

    key = staticmethod(EmbeddingCache.key)  # the on-disk cache's text key

    def get(self, key: str):
        v = self._d.get(key)
        if v is None:
            self.misses += 1
        else:
            self.hits += 1
        return v

    def put(self, key: str, vec: np.ndarray) -> None:
        self._d.put(key, vec)

    def __len__(self):
        return len(self._d)
