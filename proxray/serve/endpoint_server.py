"""Pool models proxray does not host (``engine: openai``): a hosted API, or a vLLM / SGLang / TGI server another team
runs, behind the gateway's one model interface, ``respond(endpoint, body)`` (see ``proxray.serve.models``).

An endpoint needs no replica of its own: each router replica relays to it in its own process (``EndpointRelay``; the
model client calls it as it calls a deployment's handle), which saves a Ray hop and a copy of every chunk through
the object store. Its scale is the router's (``router_replicas``), its concurrency per router replica
``max_ongoing_requests`` (default 64): a request past it is answered 429 at once, so it falls back.

The client's request goes to the endpoint as sent — messages, tools, ``response_format``, ``stream`` and its
options — with ``model`` set to the model's name there (``source``), and only the configured key as a header (none of
the client's own headers). Its response, or its stream chunk by chunk with ``usage``, comes back unchanged but for
``model``, which names the pool model the client knows. A 429, a 5xx, a timeout or a refused connection before the
first chunk is an error object the gateway falls back on, as for a co-hosted model; the key is scrubbed from every
message. ``rate_limit`` is kept by one limiter actor per model (namespace ``proxray``) that every router replica asks
before a request; a request the limit would hold past its timeout is answered 429 at once, so it falls back instead
of waiting. Latency, answers by status and waits are Prometheus metrics per model (fallbacks, the gateway's retries
on the next model, are ``proxray_fallbacks``).
"""
from __future__ import annotations

import json
import time

from proxray.serve.errors import error
from proxray.serve.models import OpenAIModel
from proxray.serve.schemas import ServedModel

NAMES = {"latency": "proxray_endpoint_latency_s", "answers": "proxray_endpoint_answers",
         "limited": "proxray_endpoint_rate_limited"}
LATENCY_BOUNDARIES = [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60]


def honoured() -> dict:
    """The request parameters an OpenAI-compatible endpoint takes, per gateway endpoint: what the openai SDK sends."""
    from openai.types import completion_create_params as completions
    from openai.types.chat import completion_create_params as chat

    return {"chat": sorted({*chat.CompletionCreateParamsBase.__annotations__, "stream"}),
            "completions": sorted({*completions.CompletionCreateParamsBase.__annotations__, "stream"})}


DEFAULT_CONCURRENCY = 64  # requests in flight to one endpoint per router replica, unless max_ongoing_requests says


def relays(handles: dict) -> dict:
    """The router's callees: deployment handles as given, and an ``EndpointRelay`` for each ``{"relay": spec}``
    (what ``build_app`` binds for an ``engine: openai`` model)."""
    return {m: EndpointRelay(h["relay"]) if isinstance(h, dict) and "relay" in h else h for m, h in handles.items()}


class EndpointRelay(OpenAIModel):
    """One ``engine: openai`` pool model, relayed from the router's process to its endpoint (``base_url``) with its
    key, limit and concurrency cap."""

    def __init__(self, spec: dict):
        import asyncio

        import httpx
        from ray.util.metrics import Counter, Histogram

        from proxray.pool.openai_engine import endpoint_key

        self.spec = ServedModel(**spec)
        self.key = endpoint_key(self.spec)
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        self.client = httpx.AsyncClient(base_url=self.spec.base_url.rstrip("/"), headers=headers,
                                        timeout=httpx.Timeout(self.spec.timeout_s, connect=min(10.0, self.spec.timeout_s)))
        self.limiter = self._limiter() if self.spec.rate_limit is not None else None
        self.cap = self.spec.max_ongoing_requests or DEFAULT_CONCURRENCY
        self.slots = asyncio.Semaphore(self.cap)
        self.latency = Histogram(NAMES["latency"], "seconds to an external endpoint's answer or first chunk",
                                 boundaries=LATENCY_BOUNDARIES, tag_keys=("model",))
        self.answers = Counter(NAMES["answers"], "external endpoint calls, by model and HTTP status (0: no answer)",
                               tag_keys=("model", "status"))
        self.limited = Counter(NAMES["limited"], "requests the model's rate limit or concurrency cap held or refused",
                               tag_keys=("model",))

    def _limiter(self):
        import ray

        from proxray.common.naming import slug
        from proxray.pool.openai_engine import RateLimiter

        limit = self.spec.rate_limit
        return ray.remote(RateLimiter).options(
            name=f"proxray-limit-{slug(self.spec.id)}", namespace="proxray", get_if_exists=True, lifetime="detached",
            num_cpus=0).remote(limit.requests_per_minute, limit.tokens_per_minute)

    async def capabilities(self) -> dict:
        return honoured()

    def _scrub(self, text: str) -> str:
        from proxray.pool.openai_engine import scrub

        return scrub(text, self.key, 2000)

    async def _respond(self, endpoint: str, body: dict):
        if self.slots.locked():
            self.limited.inc(1, {"model": self.spec.id})
            yield error(429, f"model {self.spec.id!r}: {self.cap} requests in flight to its endpoint from this router "
                             "replica (max_ongoing_requests)", kind="rate_limit_error")
            return
        async with self.slots:
            async for obj in self._relay(endpoint, body):
                yield obj

    async def _relay(self, endpoint: str, body: dict):
        import asyncio

        import httpx

        tag = {"model": self.spec.id}
        if self.limiter is not None:
            tokens = len(json.dumps(body.get("messages") or body.get("prompt") or "")) // 3 + int(
                body.get("max_completion_tokens") or body.get("max_tokens") or 256)
            delay = await self.limiter.reserve.remote(tokens)
            if delay > 0:
                self.limited.inc(1, tag)
                if delay > self.spec.timeout_s:
                    yield error(429, f"model {self.spec.id!r}: its rate limit holds the next request {delay:.0f} s",
                                kind="rate_limit_error")
                    return
                await asyncio.sleep(delay)
        path = "/chat/completions" if endpoint == "chat" else "/completions"
        sent = {**body, "model": self.spec.source or self.spec.id}
        t0 = time.perf_counter()
        try:
            async with self.client.stream("POST", path, json=sent) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    self.answers.inc(1, {**tag, "status": str(r.status_code)})
                    yield self._error(r.status_code, text)
                    return
                self.answers.inc(1, {**tag, "status": "200"})
                if not body.get("stream"):
                    obj = json.loads(await r.aread())
                    self.latency.observe(time.perf_counter() - t0, tag)
                    yield {**obj, "model": self.spec.id}
                    return
                first = True
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    if first:
                        self.latency.observe(time.perf_counter() - t0, tag)
                        first = False
                    obj = json.loads(data)
                    yield self._error(500, json.dumps(obj)) if "error" in obj else {**obj, "model": self.spec.id}
        except (httpx.TimeoutException, httpx.TransportError) as e:
            self.answers.inc(1, {**tag, "status": "0"})
            kind = "timeout" if isinstance(e, httpx.TimeoutException) else "connection"
            raise ConnectionError(f"model {self.spec.id!r} at {self.spec.base_url}: {kind}: "
                                  f"{self._scrub(str(e)) or type(e).__name__}") from None

    def _error(self, status: int, text: str) -> dict:
        """The endpoint's error as the gateway's error object, its status kept (429 and 5xx fall back)."""
        try:
            err = json.loads(text).get("error") or {}
            message, param, kind = err.get("message") or text, err.get("param"), err.get("type") or "upstream_error"
        except (ValueError, AttributeError):
            message, param, kind = text, None, "upstream_error"
        return error(status, f"model {self.spec.id!r} (endpoint {self.spec.base_url}): {self._scrub(str(message))}",
                     param, kind)
