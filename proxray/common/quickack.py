"""HTTP clients that read an answer without the delayed-ACK stall.

An upstream that writes an answer's headers and body in two writes with Nagle's algorithm on (a plain Python server,
many small in-house ones) holds the body until its headers are acknowledged, and Linux delays that ACK by up to 40 ms
on a keep-alive connection whose traffic goes back and forth (its "ping-pong" mode): every answer then waits ~40 ms
for nothing. httpx and aiohttp meet it alike (measured: 44 ms a request against 1 ms). The cure is on the reading
side: ``TCP_QUICKACK`` set again after every read (Linux clears it by itself), so what arrives is acknowledged at
once. ``async_transport`` and ``sync_transport`` are httpx's own transports, every option kept, whose connections do
that; elsewhere than Linux they are httpx's as they are. ``bench/bench_relay_stall.py`` measures it."""
from __future__ import annotations

import socket

QUICKACK = getattr(socket, "TCP_QUICKACK", None)


def _ack(sock) -> None:
    if sock is not None and QUICKACK is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
        except OSError:  # closed meanwhile, or not TCP: nothing to acknowledge
            pass


class _Stream:
    """A network stream whose every read is acknowledged at once (sync and async alike: ``read`` is wrapped either
    way, everything else passed through)."""

    def __init__(self, inner):
        self._inner = inner
        self._sock = inner.get_extra_info("socket")
        self.acks = 0

    def get_extra_info(self, info):
        return self._inner.get_extra_info(info)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _AsyncStream(_Stream):
    async def read(self, max_bytes, timeout=None):
        data = await self._inner.read(max_bytes, timeout)
        _ack(self._sock)
        self.acks += 1
        return data

    async def write(self, buffer, timeout=None):
        return await self._inner.write(buffer, timeout)

    async def aclose(self):
        return await self._inner.aclose()

    async def start_tls(self, *args, **kwargs):
        return _AsyncStream(await self._inner.start_tls(*args, **kwargs))


class _SyncStream(_Stream):
    def read(self, max_bytes, timeout=None):
        data = self._inner.read(max_bytes, timeout)
        _ack(self._sock)
        self.acks += 1
        return data

    def write(self, buffer, timeout=None):
        return self._inner.write(buffer, timeout)

    def close(self):
        return self._inner.close()

    def start_tls(self, *args, **kwargs):
        return _SyncStream(self._inner.start_tls(*args, **kwargs))


class _Backend:
    """httpcore's network backend, its TCP streams wrapped."""

    def __init__(self, inner, stream_cls):
        self._inner, self._stream_cls = inner, stream_cls

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _AsyncBackend(_Backend):
    async def connect_tcp(self, *args, **kwargs):
        return _AsyncStream(await self._inner.connect_tcp(*args, **kwargs))


class _SyncBackend(_Backend):
    def connect_tcp(self, *args, **kwargs):
        return _SyncStream(self._inner.connect_tcp(*args, **kwargs))


def async_transport(**kwargs):
    """``httpx.AsyncHTTPTransport(**kwargs)`` whose connections acknowledge every read at once."""
    import httpx

    transport = httpx.AsyncHTTPTransport(**kwargs)
    pool = transport._pool  # httpcore's connection pool, as httpx built it (TLS, limits, proxies kept)
    pool._network_backend = _AsyncBackend(pool._network_backend, _AsyncStream)
    return transport


def sync_transport(**kwargs):
    """``httpx.HTTPTransport(**kwargs)`` whose connections acknowledge every read at once."""
    import httpx

    transport = httpx.HTTPTransport(**kwargs)
    pool = transport._pool
    pool._network_backend = _SyncBackend(pool._network_backend, _SyncStream)
    return transport
