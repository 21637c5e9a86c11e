"""The routing text's embedding inside an ingress replica: the encoder (its backend, with torch as the fallback
when the ONNX build cannot be used here), the LRU of recent texts, and the batcher that fills each pass.

A static encoder takes ~0.05 ms a text: less than handing it to a worker thread costs, so texts up to
``INLINE_CHARS`` are encoded on the event loop itself, without the batcher (longer ones still go to a thread)."""
from __future__ import annotations

import logging
import time

from proxray.serve.request.encoding import EncoderBatcher

logger = logging.getLogger("ray.serve")
INLINE_CHARS = 8192  # a static encoder's text up to this long is encoded on the event loop (< ~0.5 ms)


class EncoderService:
    """``await service.vector(text, timings)`` -> the text's embedding (d,); ``id`` is the encoder id routers are
    checked against. ``timings`` gets ``embedding_cache`` (hit / miss), ``embed_ms`` and, for a miss, the pass's
    ``encoder_batch`` size (0: encoded inline) and ``encode_ms``."""

    def __init__(self, encoder: str | None, backend: str = "onnx", threads: int | None = None,
                 cache_entries: int = 10_000, batch_wait_s: float = 0.0, max_batch: int = 32):
        from proxray.embeddings.cache import LRUEmbeddings
        from proxray.embeddings.encoder import SentenceEncoder

        self.encoder = SentenceEncoder(encoder, cache=False, progress=False, backend=backend, threads=threads)
        try:
            self.encoder.encode(["warm-up"])  # load (or export) the encoder now, not on the first request
        except Exception as e:  # noqa: BLE001 - no writable cache, a pipeline ONNX cannot hold: serve anyway
            if backend == "torch":
                raise
            logger.warning("proxray: encoder backend %s unavailable (%s); using torch", backend, e)
            self.encoder = SentenceEncoder(encoder, cache=False, progress=False)
            self.encoder.encode(["warm-up"])
        self.embeddings = LRUEmbeddings(cache_entries)
        self.asked = 0  # texts asked for (from the LRU or the encoder)
        self.batcher = EncoderBatcher(self.encoder.encode, max_batch=max_batch, wait_s=batch_wait_s)

    @property
    def id(self) -> str:
        return self.encoder.id

    async def vector(self, text: str, timings: dict, tenant: str = ""):
        """From the LRU (no thread hop, no batch) or the next encoder pass, shared with whatever else is queued. The LRU
        is kept apart per ``tenant`` (an API key's hash): no key's hit or speed says what another key sent."""
        t0 = time.perf_counter()
        self.asked += 1
        key = self.embeddings.key(f"{tenant}\x00{text}" if tenant else text)
        v = self.embeddings.get(key)
        timings["embedding_cache"] = "hit" if v is not None else "miss"
        if v is None and self.encoder.static and len(text) <= INLINE_CHARS:
            v = self.encoder.encode([text])[0]
            timings["encoder_batch"], timings["encode_ms"] = 0, 1e3 * (time.perf_counter() - t0)
        elif v is None:
            v, timings["encoder_batch"], timings["encode_ms"] = await self.batcher.encode(text)
        if timings["embedding_cache"] == "miss":
            self.embeddings.put(key, v)
        timings["embed_ms"] = 1e3 * (time.perf_counter() - t0)
        return v
