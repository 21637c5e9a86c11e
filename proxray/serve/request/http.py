"""The gateway's HTTP boundary, kept thin: reading and bounding a body, parsing and validating it, errors in a
protocol's shape, response headers, and the FastAPI app: a route for each protocol of the table
(``proxray.serve.protocols.PROTOCOLS``) and the gateway's own (models, feedback, health)."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from proxray.serve.errors import RequestError, openai_shape, validation_message
from proxray.serve.tenancy.feedback import FeedbackRequest

MAX_DEPTH = 32  # JSON nesting a request may have
PARSE_INLINE_BYTES = 64 * 1024  # bigger bodies are parsed in a worker thread, off the event loop
# what a browser page may read of a cross-origin answer besides the CORS-safelisted headers
EXPOSED_HEADERS = ["x-request-id", "x-proxray-model", "x-proxray-routed", "x-proxray-outlier-score",
                   "x-proxray-estimated-cost", "x-proxray-fallback-from", "x-proxray-dropped"]


@dataclass(frozen=True)
class Route:
    """A route beside a protocol's main one (a protocol's ``count_tokens``, a stored response's; the gateway's own):
    ``handler(gateway)`` is the FastAPI endpoint, composed from the gateway's parts (``proxray.serve.gateway``); ``summary``: what it does, for the
    HTTP reference (``docs/reference/http.md``); ``request``: the pydantic model of its body, where it takes one."""

    method: str
    path: str
    handler: Callable[[Any], Callable]
    summary: str = ""
    request: type | None = None


# the gateway's own routes, after the protocols' (``gateway_api``)
GATEWAY_ROUTES = (
    Route("POST", "/v1/feedback", lambda gw: gw.feedback,
          "a score in [0, 1] for an answer this endpoint gave (its id), counted per model and passed to the drift "
          "monitor as labels; needs `feedback` on in the app", FeedbackRequest),
    Route("GET", "/v1/models", lambda gw: gw.listing.list,
          "the models a caller may name: `proxray` (the router) first, then every served model its key may use"),
    Route("GET", "/v1/models/{model:path}", lambda gw: gw.listing.get,
          "one model of that list (ids hold `/`: the openai SDK sends it as `%2F`)"),
    Route("GET", "/health", lambda gw: gw.health,
          "readiness for probes and load balancers, without a key: `{\"status\": \"ok\"}` once every served model "
          "has had a running replica, before that 503 `{\"status\": \"starting\", \"models_starting\": n}`"),
)


def error_response(e: RequestError, shape=openai_shape) -> JSONResponse:
    """``e`` in a protocol's error shape (``shape(e)`` -> (status, body); OpenAI's by default)."""
    status, body = shape(e)
    return JSONResponse(body, status_code=status, headers=e.headers or None)


def check_json(value) -> None:
    """Refuse what no model needs and some parsers choke on: nesting deeper than MAX_DEPTH and integers
    outside a signed 64-bit range (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int) and not -2**63 <= v < 2**63:
            raise RequestError(400, "an integer in the body does not fit 64 bits")
        if isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise RequestError(400, f"the body is nested deeper than {MAX_DEPTH} levels")
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))


def parse_json(body: bytes):
    try:
        raw = json.loads(body)
    except RecursionError:
        raise RequestError(400, f"the body is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int digit limits
        raise RequestError(400, f"body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(raw, dict):
        raise RequestError(400, "body must be a JSON object")
    check_json(raw)
    return raw


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) past ``limit`` bytes by its Content-Length and while reading."""
    too_big = RequestError(413, f"request body over {limit} bytes", kind="request_too_large")
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_request(request: Request, model_cls, limit: int, timings: dict | None = None):
    """The request as ``model_cls`` (a pydantic model): bounded, parsed (large bodies off the event loop),
    validated; every problem a 4xx ``RequestError`` naming the field. ``timings["read_ms"]``: the wait for the body
    (the client, the proxy and the event loop's other work), apart from the parsing that follows."""
    t0 = time.perf_counter()
    body = await read_body(request, limit)
    if timings is not None:
        timings["read_ms"] = 1e3 * (time.perf_counter() - t0)
    raw = parse_json(body) if len(body) <= PARSE_INLINE_BYTES else await asyncio.to_thread(parse_json, body)
    try:
        return model_cls.model_validate(raw)
    except ValidationError as e:
        msg, loc = validation_message(e)
        raise RequestError(400, msg, loc) from None


def response_headers(report: dict) -> dict:
    """The ``x-proxray-*`` headers of an answer, from its ``proxray`` report."""
    h = {"x-proxray-model": report["model"], "x-proxray-routed": str(report["routed"]).lower()}
    if report.get("routed"):
        h["x-proxray-outlier-score"] = f"{report['outlier_score']:.6g}"  # as the report has it (coarse for a key)
        h["x-proxray-estimated-cost"] = f"{report['estimated_cost']:.6g}"
    if report["fallback_from"]:
        h["x-proxray-fallback-from"] = ",".join(report["fallback_from"])
    if report.get("dropped"):
        h["x-proxray-dropped"] = ",".join(report["dropped"])[:1024]
    return h


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """A path or method the gateway does not serve (404, 405) answers in OpenAI's error shape, like every
    other error, so clients report it as they report the API's own (405 keeps its ``Allow`` header)."""
    path = request.url.path[:200]
    if exc.status_code == 404:  # the routes as the app has them (gateway_api), not a second list to keep in step
        served = ", ".join(f"{m} {r.path_format}" for r in request.app.routes for m in sorted(getattr(r, "methods", ()))
                           if m != "HEAD")
        e = RequestError(404, f"no such path {path}; served: {served}", kind="not_found_error")
    elif exc.status_code == 405:
        e = RequestError(405, f"{request.method} is not allowed on {path}", kind="invalid_request_error")
    else:
        e = RequestError(exc.status_code, str(exc.detail)[:200])
    return JSONResponse(e.body(), status_code=e.status, headers=exc.headers)


def gateway_api(gateway, endpoint) -> FastAPI:
    """The ingress's HTTP surface, built in each replica from its app args (Ray Serve's late-bound
    ``__serve_build_asgi_app__``): for each protocol of the gateway's table (``{route: Protocol}``) its route, answered
    by ``endpoint(protocol)`` (the one request path), and the routes it adds; then the gateway's own. A route's handler
    is given the ``gateway`` (its parts), never the ingress. ``/docs`` and ``/openapi.json`` exist with ``docs: true``
    only, CORS headers with ``cors_origins`` only."""
    args = gateway.args
    on = args.docs
    app = FastAPI(title="proxray", description="OpenAI-compatible endpoint routed by ProxRouter", redoc_url=None,
                  docs_url="/docs" if on else None, openapi_url="/openapi.json" if on else None)
    app.add_exception_handler(StarletteHTTPException, http_error)
    if args.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        # the key travels in the Authorization header, not as a browser credential (cookies): no allow_credentials
        app.add_middleware(CORSMiddleware, allow_origins=args.cors_origins, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["*"], expose_headers=EXPOSED_HEADERS, max_age=600)
    for route, protocol in gateway.protocols.items():
        app.post(route)(endpoint(protocol))
        for extra in protocol.routes:
            app.add_api_route(extra.path, extra.handler(gateway), methods=[extra.method])
    for extra in GATEWAY_ROUTES:
        app.add_api_route(extra.path, extra.handler(gateway), methods=[extra.method])
    return app
