"""Pool models proxray does not host (``engine: openai``): a hosted API, or a vLLM / SGLang / TGI server another team
runs, behind the gateway's one model interface, ``respond(endpoint, body)`` (see ``proxray.serve.deployments.models``).

An endpoint needs no replica of its own: each router replica relays to it in its own process (``EndpointRelay``; the
model client calls it as it calls a deployment's handle), which saves a Ray hop and a copy of every chunk through
the object store. Its scale is the router's (``router_replicas``), its concurrency per router replica
``max_ongoing_requests`` (default 64): a request past it is answered 429 at once, so it falls back.

The client's request goes to the endpoint as sent — messages, tools, ``response_format``, ``stream`` and its
options — with ``model`` set to the model's name there (``source``), and only the configured key as a header (none of
the client's own headers). Its response, or its stream chunk by chunk with ``usage``, comes back unchanged but for
``model``, which names the pool model the client knows.

* **Retries**, as ``proxray.pool.upstream.verdict`` decides for the job too: a 408, 409, 429, a 5xx, or a refused or
  dropped connection before the first byte is tried again (``max_retries``) after the endpoint's ``Retry-After``, else
  an exponential backoff, as long as the wait ends within the model's ``timeout_s``; then it is an error object the
  gateway falls back on, as for a co-hosted model. A 400, 422 or any other 4xx about the request goes to the client at
  once, and nothing is tried again once the endpoint has taken the request — answered 200 (a connection that breaks
  after it is a 502), or read it and gave no answer in time (it may be generating, and billing, it).
* **Operator faults**, on the endpoint's word, never a client's: a 404 whose error object says the model is unknown
  (``model_not_found``, Anthropic's ``not_found_error`` on ``model:``), or — after any other 404, a 401 or a 403,
  which a client's body can provoke — a probe with the gateway's own key and nothing of the client's (``GET /models``)
  that is refused or no longer lists the model, takes the model out of routing for ``COOLDOWN_S`` (and tells the
  model client's liveness, so routed requests try it last): routed requests fall back, a request naming it gets a 502
  naming the model — never the endpoint's 401, which would tell the client its own key is wrong. Otherwise the error is
  the client's alone and takes nothing out. The log and ``proxray_endpoint_cooldowns`` say why.
* **What a client sees** of an endpoint: the model's name and the status, never its URL, host or key (the log has the
  URL; the key is scrubbed everywhere).
* **Limits.** ``rate_limit`` is kept by one limiter actor per model (namespace ``proxray``) that every router replica
  asks before a request; a request the limit would hold past its timeout is answered 429 at once without taking a
  slot, so it falls back instead of waiting, and the limiter serves again as soon as the load falls under it.

Latency, answers by status, retries, waits and cool-downs are Prometheus metrics per model (fallbacks, the gateway's
tries of the next model, are ``proxray_fallbacks``).
"""
from __future__ import annotations

import json
import logging
import time

from proxray.common.pricing import Usage
from proxray.common.secrets import scrub
from proxray.common.shared_actor import SharedActorClient, SharedStateDown
from proxray.common.tracing import TRACE_HEADERS
from proxray.pool.upstream import (ASK_LISTING, RETRY, TAKE_OUT, error_object, lists_model, probe_headers,
                                   refused_parameter, verdict)
from proxray.serve.config import ServedModel
from proxray.serve.deployments.models import OpenAIModel
from proxray.serve.errors import error, is_error
from proxray.serve.wire import BOUND, COUNT_PATH, DEADLINE, UpstreamHeaders, measure, reached_on_send

COOLDOWN_S = 60.0  # a model whose endpoint refuses the gateway's key, or does not know it, is left out this long
logger = logging.getLogger("ray.serve")


DEFAULT_CONCURRENCY = 64  # requests in flight to one endpoint per router replica, unless max_ongoing_requests says


def relays(handles: dict, honoured_of=None) -> dict:
    """The router's callees: deployment handles as given, and an ``EndpointRelay`` for each ``{"relay": spec}``
    (what ``build_app`` binds for an ``engine: openai`` model); ``honoured_of(spec)``: what its endpoint takes, per
    upstream path (the client protocols it serves: ``proxray.serve.protocols``)."""
    honoured_of = honoured_of or (lambda spec: {})
    out = {}
    for m, h in handles.items():
        if isinstance(h, dict) and "relay" in h:
            spec = ServedModel(**h["relay"])
            h = EndpointRelay(spec, honoured_of(spec))
        out[m] = h
    return out


class EndpointRelay(OpenAIModel):
    """One ``engine: openai`` pool model, relayed from the router's process to its endpoint (``base_url``) with its
    key, limit and concurrency cap."""

    def __init__(self, spec, honoured: dict | None = None):
        import asyncio

        import httpx
        from proxray.common.metric_defs import metric

        from proxray.common.quickack import async_transport
        from proxray.pool.openai_engine import endpoint_key

        self.spec = spec if isinstance(spec, ServedModel) else ServedModel(**spec)
        self.honoured = honoured or {}  # upstream path -> the parameters its endpoint takes there
        self.key = endpoint_key(self.spec)
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        self.client = httpx.AsyncClient(base_url=self.spec.base_url.rstrip("/"), headers=headers,
                                        transport=async_transport(),  # no delayed-ACK stall (proxray.common.quickack)
                                        timeout=httpx.Timeout(self.spec.timeout_s, connect=min(10.0, self.spec.timeout_s)))
        self.limiter = LimiterClient(self.spec) if self.spec.rate_limit is not None else None
        self.cap = self.spec.max_ongoing_requests or DEFAULT_CONCURRENCY
        self.slots = asyncio.Semaphore(self.cap)
        self.latency = metric("proxray_endpoint_latency_s")
        self.answers = metric("proxray_endpoint_answers")
        self.limited = metric("proxray_endpoint_rate_limited")
        self.retries = metric("proxray_endpoint_retries")
        self.cooldowns = metric("proxray_endpoint_cooldowns")
        self.cooldown_until, self.cooldown_why = 0.0, ""
        self.on_out = None  # told (model, seconds) when the model is taken out: the model client's Liveness

    async def capabilities(self) -> dict:
        return self.honoured  # a path with none there (Messages) takes the request as it is: no refusals

    def _scrub(self, text: str) -> str:
        return scrub(text, 2000, key=self.key)

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

        tag = {"model": self.spec.id}
        if time.monotonic() < self.cooldown_until:
            yield error(502, f"model {self.spec.id!r} is out of routing for {self.cooldown_until - time.monotonic():.0f} s "
                             f"more: {self.cooldown_why}", kind="upstream_error")
            return
        deadline = time.monotonic() + self.spec.timeout_s
        sent = {**body, "model": self.spec.source or self.spec.id}
        given = sent.pop(UpstreamHeaders.FIELD, None)  # a protocol's headers; a client's own field is dropped
        # what the rate limit books: the request's bound, as a budget's hold; nothing for a count (COUNT_PATH)
        limiter = self.limiter if endpoint != COUNT_PATH else None
        tokens = ((BOUND.get() or measure(sent)).tokens or 256) if limiter is not None else 0
        if limiter is not None and limiter.tpm:
            tokens = min(tokens, int(limiter.tpm))  # as the limiter books it (RateLimiter.reserve)
        path, headers = endpoint, {}
        if isinstance(given, UpstreamHeaders):
            headers = given.sent_to(self.spec.price)
            if given.key_header and self.key:
                headers[given.key_header] = self.key
        headers.update(TRACE_HEADERS.get() or {})  # the request's model-call span, where tracing is on
        # the limiter keeps a request waiting within the model's timeout and the request's own (the gateway's)
        patience = min(deadline, DEADLINE.get() or deadline)
        for attempt in range(self.spec.max_retries + 1):
            if limiter is not None:
                delay = await limiter.reserve(tokens, max(0.0, patience - time.monotonic()))
                if delay is None:  # refused, nothing booked: it falls back
                    self.limited.inc(1, tag)
                    yield error(429, f"model {self.spec.id!r}: its rate limit cannot take the request within its "
                                     f"timeout_s={self.spec.timeout_s:g} s or the request's own deadline",
                                kind="rate_limit_error")
                    return
                if delay > 0:
                    self.limited.inc(1, tag)
                    await asyncio.sleep(delay)
            failure, tried, used = None, self._attempt(path, sent, body.get("stream"), tag, headers), None
            try:
                async for obj in tried:
                    if isinstance(obj, Retry):
                        failure = obj
                        break
                    used = usage_in(obj, used)
                    yield obj
            finally:
                await tried.aclose()  # the connection goes back now, also when the caller went away
                if limiter is not None and failure is None:  # the booking corrected to what was used, where told
                    limiter.correct(tokens, used.prompt + used.output if used is not None else None)
                elif limiter is not None and not failure.accepted:  # refused or never reached: nothing generated,
                    limiter.correct(tokens, 0)  # so nothing of the endpoint's limit is kept from other keys
            if failure is None:
                return
            decision, wait = verdict(failure.status, failure.upstream, attempt, self.spec.max_retries,
                                     deadline - time.monotonic(), failure.retry_after, answered=failure.accepted)
            why = f"its endpoint does not serve it (HTTP {failure.status})"
            if decision == ASK_LISTING:  # a 401, 403 or 404 a client's body could provoke: the gateway's own probe
                refused = await self._probe()
                if refused is None and failure.status == 401:  # the gateway's key is accepted: not the client's key
                    yield error(502, f"model {self.spec.id!r}: its endpoint answered 401 to this request, though it "
                                     "accepts the gateway's key", kind="upstream_error")
                    return
                decision = TAKE_OUT if refused else decision
                why = refused or why
            if decision == TAKE_OUT:  # the operator's fault, not the request's nor a passing one
                yield self._cool_down(failure, why)
                return
            if decision != RETRY:  # the request's own fault (the client has it at once), or this endpoint spent
                yield failure.error
                return
            self.retries.inc(1, tag)
            await asyncio.sleep(wait)

    async def _attempt(self, path: str, sent: dict, stream: bool, tag: dict, headers: dict | None = None):
        """One try: the answer or its chunks, or a ``Retry`` where it failed before its first byte (a status other
        than 200, a timeout or a refused connection); a failure after the first chunk is an error object."""
        import httpx

        t0, first, answered = time.perf_counter(), True, False
        try:
            async with self.client.stream("POST", path, json=sent, headers=headers or None,
                                          extensions={"trace": reached_on_send(self.spec.id)}) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    self.answers.inc(1, {**tag, "status": str(r.status_code)})
                    upstream = error_object(text)  # read once: for the client's error and for the verdict
                    yield Retry(r.status_code, self._error(r.status_code, text, upstream), r.headers.get("retry-after"),
                                upstream)
                    return
                answered = True  # from here on nothing is tried again: the answer is being generated
                self.answers.inc(1, {**tag, "status": "200"})
                if not stream:
                    obj = json.loads(await r.aread())
                    self.latency.observe(time.perf_counter() - t0, tag)
                    yield self._named(obj)
                    return
                async for line in r.aiter_lines():  # after the first chunk a failure is one mid-stream
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    if first:
                        self.latency.observe(time.perf_counter() - t0, tag)
                        first = False
                    obj = json.loads(data)
                    yield self._error(500, json.dumps(obj)) if is_error(obj) else self._named(obj)
        except (httpx.TimeoutException, httpx.TransportError) as e:
            self.answers.inc(1, {**tag, "status": "0"})
            kind = "timeout" if isinstance(e, httpx.TimeoutException) else "connection"
            logger.warning("proxray: model %s at %s: %s: %s", self.spec.id, self.spec.base_url, kind,
                           self._scrub(str(e)) or type(e).__name__)
            if answered:  # it answered 200, then broke off: generated once, never asked again (nor paid for twice)
                what = "failed mid-stream" if stream else "answered 200, then its answer broke off"
                yield error(502, f"model {self.spec.id!r}: its endpoint {what} ({kind})", kind="server_error")
                return
            # sent, then no answer in time: the endpoint took the request and may be generating it (and billing it),
            # so it is not asked again; a refused or dropped connection is (nothing was generated)
            took = isinstance(e, httpx.ReadTimeout)
            yield Retry(503, error(503, f"model {self.spec.id!r}: its endpoint did not answer ({kind})",
                                   kind="upstream_error"), None, accepted=took)

    def _named(self, obj: dict) -> dict:
        """An answer, chunk or event with the pool model's id for the endpoint's name of it (a Responses event holds
        it in its ``response``)."""
        for inner in ("response", "message"):  # a Responses event's response, a Messages stream's message_start
            if isinstance(obj.get(inner), dict):
                return {**obj, inner: {**obj[inner], "model": self.spec.id}}
        return {**obj, "model": self.spec.id} if "model" in obj or "choices" in obj else obj

    async def _probe(self) -> str | None:
        """Why the endpoint no longer serves the model to the gateway, from its ``GET /models`` with the gateway's own key
        and nothing of any client's — it refuses that key (401, 403), or does not list the model — or None where it
        does, or where it cannot tell (unreachable, another status, not JSON: nothing is taken out on a guess)."""
        try:
            r = await self.client.get("/models", timeout=5.0, headers=probe_headers(self.key))
            if r.status_code in (401, 403):
                return f"its endpoint refused the gateway's key (HTTP {r.status_code})"
            if r.status_code == 200 and not lists_model(r.json(), self.spec.source or self.spec.id):
                return "its endpoint does not list it (GET /models)"
        except Exception:  # noqa: BLE001 - unreachable or not JSON: it cannot tell
            pass
        return None

    def _cool_down(self, failure: "Retry", why: str) -> dict:
        """Take the model out of routing for ``COOLDOWN_S``: its endpoint refused the gateway's key or does not know
        the model, which no client can fix; the operator is told in the log and the metric."""
        self.cooldown_until, self.cooldown_why = time.monotonic() + COOLDOWN_S, why
        self.cooldowns.inc(1, {"model": self.spec.id, "status": str(failure.status)})
        if self.on_out is not None:
            self.on_out(self.spec.id, COOLDOWN_S)
        logger.warning("proxray: model %s at %s taken out of routing for %.0f s: %s (%s)", self.spec.id,
                       self.spec.base_url, COOLDOWN_S, why, failure.error["error"]["message"][:300])
        return error(502, f"model {self.spec.id!r}: {why}; out of routing for {COOLDOWN_S:.0f} s", kind="upstream_error")

    def _error(self, status: int, text: str, upstream: dict | None = None) -> dict:
        """The endpoint's error (its body ``text``; ``upstream``: its error object, where already read) as the gateway's
        error object, its status kept (429 and 5xx fall back)."""
        err = error_object(text) if upstream is None else upstream
        message, param, kind = err.get("message") or text, err.get("param"), err.get("type") or "upstream_error"
        return error(status, f"model {self.spec.id!r}: its endpoint answered {status}: {self._scrub(str(message))}",
                     param, kind, unsupported=refused_parameter(status, err) is not None)


def usage_in(obj: dict, seen: Usage | None) -> Usage | None:
    """An endpoint's usage so far, with what ``obj`` (an answer, a chunk or an event, in any API's words) adds."""
    if not isinstance(obj, dict):
        return seen
    if set(obj) == {"input_tokens"}:  # a token count's answer (Messages' count_tokens): what it counted
        return Usage(input=int(obj["input_tokens"] or 0))
    for holder in (obj, obj.get("response"), obj.get("message")):  # a Responses event's response, message_start's
        u = Usage.of_any(holder.get("usage")) if isinstance(holder, dict) else None
        if u is not None:
            return u.merged(seen)
    return seen


class LimiterClient(SharedActorClient):
    """The model's ``RateLimiter`` actor (``proxray-limit-<model>``), shared by every router replica of every app on the
    cluster that relays to it, told the limits of the caller's config on every call. A limiter that does not answer
    fails open (logged): the endpoint's own 429s, retried, still hold the rate."""

    prefix = "proxray-limit"

    def __init__(self, spec):
        from proxray.common.naming import slug
        from proxray.pool.openai_engine import RateLimiter

        self.actor_cls = RateLimiter
        super().__init__(slug(spec.id), spec)
        self.limits = (spec.rate_limit.requests_per_minute, spec.rate_limit.tokens_per_minute)
        self.tpm = spec.rate_limit.tokens_per_minute

    def actor_args(self) -> tuple:
        return self.limits

    def correct(self, reserved: int, used: int | None) -> None:
        """A relayed answer's booking of ``reserved`` tokens corrected to the ``used`` its endpoint reported (input
        and output; a count's input alone), sent without waiting; nothing where the endpoint reported none."""
        if used is not None and self.tpm and used != reserved:
            self.tell("correct", reserved, int(used))

    async def reserve(self, tokens: int, max_wait: float) -> float | None:
        try:  # the wait counted from now, not from when the limiter answered (RateLimiter.start_at)
            at = await self.call("start_at", tokens, max_wait, self.limits)
            return None if at is None else at - time.time()
        except SharedStateDown as e:
            logger.warning("proxray: %s: %s; the request goes without it", self.name, e.why)
            return 0.0


class Retry:
    """A try that failed before its first byte: the endpoint's status, the gateway's error object for it, its
    ``Retry-After``, and the endpoint's own error (``upstream``: what ``proxray.pool.upstream`` reads)."""

    def __init__(self, status: int, err: dict, retry_after: str | None, upstream: dict | None = None,
                 accepted: bool = False):
        self.status, self.error, self.retry_after, self.upstream = status, err, retry_after, upstream or {}
        self.accepted = accepted  # the endpoint took the request (a read timed out): never asked again
