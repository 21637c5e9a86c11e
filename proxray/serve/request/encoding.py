"""The ingress's encoder queue: one encoder pass at a time, over everything queued when the encoder frees.

Ray Serve's ``@serve.batch`` (2.60) forms a batch as soon as requests arrive and makes it wait for the
previous one to finish (``max_concurrent_batches``), so under load it encodes many batches of one or two
texts in a row (measured: mean batch 1.3 at 8 concurrent requests, each waiting ~6 passes). Here the
batch is formed when the encoder is free: whatever arrived during the previous pass goes into the next
one (up to ``max_batch``), optionally after waiting ``wait_s`` for more.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable


class EncoderBatcher:
    """``await batcher.encode(text)`` -> (vector, size of the pass it was in, the pass's ms).

    ``encode_fn(texts) -> (n, d) array`` runs in a worker thread (the event loop keeps serving)."""

    def __init__(self, encode_fn: Callable, max_batch: int = 32, wait_s: float = 0.0):
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch!r}: must be >= 1")
        self.encode_fn, self.max_batch, self.wait_s = encode_fn, max_batch, wait_s
        self.queue: list = []  # (text, future) waiting for the next pass
        self.busy = False
        self._worker = None  # the draining task (kept referenced while it runs)

    def _timed(self, texts: list):
        t0 = time.perf_counter()
        X = self.encode_fn(texts)
        return X, 1e3 * (time.perf_counter() - t0)

    async def encode(self, text: str):
        fut = asyncio.get_running_loop().create_future()
        self.queue.append((text, fut))
        if not self.busy:
            self.busy = True
            self._worker = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            while self.queue:
                if self.wait_s and len(self.queue) < self.max_batch:
                    await asyncio.sleep(self.wait_s)
                batch, self.queue = self.queue[:self.max_batch], self.queue[self.max_batch:]
                batch = [(t, f) for t, f in batch if not f.done()]  # a cancelled request is not encoded
                if not batch:
                    continue
                try:
                    X, ms = await asyncio.to_thread(self._timed, [t for t, _ in batch])
                except Exception as e:  # noqa: BLE001 - every waiter of this pass gets the error
                    for _, f in batch:
                        if not f.done():
                            f.set_exception(e)
                    continue
                for (_, f), x in zip(batch, X):
                    if not f.done():
                        f.set_result((x, len(batch), ms))
        finally:
            self.busy = False
