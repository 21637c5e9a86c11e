"""The relay's and the job's HTTP clients acknowledge every read at once (``proxray.common.quickack``): against an
upstream that writes headers and body apart with Nagle on, their answers are whole and each read was acknowledged;
every httpx option still applies. What it saves is measured by bench/bench_relay_stall.py, not here."""
import asyncio
import os
import sys

import httpx
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from bench_relay_stall import BODY, standin  # noqa: E402

from proxray.common import quickack  # noqa: E402


def test_async_and_sync_clients_read_whole_answers_acknowledging_every_read():
    url = f"http://127.0.0.1:{standin(nodelay=False)}"
    transport = quickack.async_transport(retries=1)

    async def ask():
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            return [(await client.post(f"{url}/v1/chat/completions", json={"n": i})).content for i in range(3)]

    assert asyncio.run(ask()) == [BODY] * 3
    with httpx.Client(transport=quickack.sync_transport(), timeout=5) as client:
        assert client.post(f"{url}/v1/chat/completions", json={}).json()["usage"]["total_tokens"] == 4
        (conn,) = client._transport._pool.connections
        stream = conn._connection._network_stream
        assert isinstance(stream, quickack._SyncStream) and stream.acks >= 1
    if quickack.QUICKACK is None:
        pytest.skip("TCP_QUICKACK is Linux's: elsewhere the transports are httpx's own")
