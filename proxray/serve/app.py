"""The routed, OpenAI-compatible endpoint as one Ray Serve application.

    RouterIngress (FastAPI)  --DeploymentHandle.respond-->  ModelServer "<model a>"        (CPU engines)
      composes: request parsing (schemas),                  VLLMModelServer "<model b>"   (ray.serve.llm)
      routing plan (plan), model client (client),           ... every one: respond(endpoint, body)
      stream writer (sse), monitor client, metrics

The client's request goes to the chosen model as sent (only ``model`` is rewritten); the model's response
or chunk stream comes back unchanged, with a ``proxray`` object added (and ``x-proxray-*`` headers).
``build_app(args)`` is the ``import_path`` target (``proxray.serve.app:build_app``); ``args`` follow
``proxray.serve.schemas.AppArgs``. Handles are injected through ``.bind()``, so tests compose the same app
from small real parts. Each ingress replica builds its FastAPI app from its own args (``gateway_api``, Serve's
late-bound ``__serve_build_asgi_app__``, as ray.serve.llm's ``LLMServer`` does), so docs and CORS are per app.
"""

import asyncio
import hmac
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from proxray.routing.objective import objective
from proxray.serve import plan as planning
from proxray.serve.client import ModelClient, ModelError, failure_reason
from proxray.serve.encoding import EncoderBatcher
from proxray.serve.models import ModelServer, refused_parameters
from proxray.serve.plan import RequestError
from proxray.serve.schemas import (ROUTER_MODEL, AppArgs, ChatRequest, CompletionRequest, ServedModel, load_api_key,
                      routing_text, validation_message)
from proxray.serve.sse import relay

logger = logging.getLogger("ray.serve")
MAX_DEPTH = 32  # JSON nesting a request may have
PARSE_INLINE_BYTES = 64 * 1024  # bigger bodies are parsed in a worker thread, off the event loop


def deployment_name(model_id: str) -> str:
    from proxray.common.naming import slug

    return slug(model_id)


def error_response(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


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


def _has_content(obj: dict) -> bool:
    """A chunk that commits the stream to its model: any text, a tool call, a finish reason, or usage."""
    if obj.get("usage") and not obj.get("choices"):
        return True
    for c in obj.get("choices") or []:
        d = c.get("delta") or {}
        if c.get("text") or d.get("content") or d.get("tool_calls") or d.get("reasoning_content") or c.get("finish_reason"):
            return True
    return False


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


# what a browser page may read of a cross-origin answer besides the CORS-safelisted headers
EXPOSED_HEADERS = ["x-request-id", "x-proxray-model", "x-proxray-routed", "x-proxray-outlier-score",
                   "x-proxray-estimated-cost", "x-proxray-fallback-from"]


def gateway_api(ingress: "RouterIngress", args: AppArgs) -> FastAPI:
    """The ingress's HTTP surface, built in each replica from its app args (Ray Serve's late-bound
    ``__serve_build_asgi_app__``): the routes are the ingress's own methods; ``/docs`` and ``/openapi.json``
    exist with ``docs: true`` only, CORS headers with ``cors_origins`` only."""
    on = args.docs
    app = FastAPI(title="proxray", description="OpenAI-compatible endpoint routed by ProxRouter", redoc_url=None,
                  docs_url="/docs" if on else None, openapi_url="/openapi.json" if on else None)
    app.add_exception_handler(StarletteHTTPException, http_error)
    if args.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        # the key travels in the Authorization header, not as a browser credential (cookies): no allow_credentials
        app.add_middleware(CORSMiddleware, allow_origins=args.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["*"], expose_headers=EXPOSED_HEADERS, max_age=600)
    app.post("/v1/chat/completions")(ingress.chat)
    app.post("/v1/completions")(ingress.completions)
    app.get("/v1/models")(ingress.models)
    app.get("/v1/models/{model:path}")(ingress.model)  # :path - ids hold "/" (the openai SDK sends it as %2F)
    app.get("/health")(ingress.health)
    return app


@serve.deployment
@serve.ingress()
class RouterIngress:
    """Composes the pieces per request: parse and bound the request, plan (route or pass through), call the
    chosen model through the model client with fallback, write the answer or the stream."""

    def __init__(self, args: dict, handles: dict):
        from proxray.routing.registry import load_router
        from proxray.embeddings.cache import LRUEmbeddings
        from proxray.embeddings.encoder import SentenceEncoder
        from proxray.serve.metrics import GatewayMetrics

        self.args = AppArgs(**args)
        self.encoder = SentenceEncoder(self.args.encoder, cache=False, progress=False,
                                       backend=self.args.encoder_backend, threads=self.args.encoder_threads)
        try:
            self.encoder.encode(["warm-up"])  # load (or export) the encoder now, not on the first request
        except Exception as e:  # noqa: BLE001 - no writable cache, a pipeline ONNX cannot hold: serve anyway
            if self.args.encoder_backend == "torch":
                raise
            logger.warning("proxray: encoder backend %s unavailable (%s); using torch", self.args.encoder_backend, e)
            self.encoder = SentenceEncoder(self.args.encoder, cache=False, progress=False)
            self.encoder.encode(["warm-up"])
        self.embeddings = LRUEmbeddings(self.args.embedding_cache_entries)
        self.batcher = EncoderBatcher(self.encoder.encode, max_batch=32, wait_s=self.args.embed_batch_wait_s)
        self.router = load_router(self.args.router, encoder_id=self.encoder.id)
        if not hasattr(self.router, "estimate_with_outlier_score"):
            raise ValueError(f"{self.args.router}: serving needs a KNNRouter or KMeansRouter artifact "
                             f"(it reports outlier scores), not a {type(self.router).__name__}")
        self.client = ModelClient(handles)
        self.caps = {}  # model id -> {endpoint: frozenset of parameters it honours}, asked lazily
        self.caps_retry = {}  # model id -> when to ask again a model that did not answer
        self.kinds = {m.id: m.engine for m in self.args.models}
        self.routable = [m for m in self.router.models_ if m in handles]
        if not self.routable:
            raise ValueError(f"none of the router's models {self.router.models_} is served ({sorted(handles)})")
        self.api_key = load_api_key(self.args)
        self.budget = None
        if self.args.budget is not None:
            from proxray.serve.budget import BudgetController

            b = self.args.budget
            self.budget = BudgetController(b.cost_per_query, b.lam0, b.window, b.gain, basis=b.basis,
                                           prices={m.id: m.price for m in self.args.models if m.price is not None})
        self.requests = 0
        self.created = int(time.time())  # the model objects' "created"
        self.router_path = self.args.router
        self.metrics = GatewayMetrics()
        self.monitor = None
        if self.args.monitor:
            from proxray.serve.monitor_client import MonitorClient

            self.monitor = MonitorClient(self.args.monitor, self.args.reload_every_s, self.router_path,
                                         self.encoder.id, self._use_router)

    def _use_router(self, router, path: str) -> None:
        """Switch routers between requests: a request reads (router, path) once and routes with that router's
        own model list, so none is answered through a mismatched list; a model the new router knows but the
        app does not serve is never chosen (``planning.routed`` allows served models only)."""
        routable = [m for m in router.models_ if m in self.client.handles]
        if not routable:
            logger.warning("proxray: router %s has no served model; keeping %s", path, self.router_path)
            return
        self.router, self.router_path, self.routable = router, path, routable

    # ---- boundary ------------------------------------------------------------------------------
    def _check_auth(self, request: Request) -> None:
        if not self.api_key:
            return
        header = request.headers.get("authorization", "")
        token = header[7:].encode() if header.lower().startswith("bearer ") else b""
        if not hmac.compare_digest(token, self.api_key):  # constant time; the key is never logged
            raise RequestError(401, "missing or invalid API key (Authorization: Bearer …)", kind="authentication_error")

    async def _read(self, request: Request) -> bytes:
        """The body, refused (413) past ``max_body_bytes`` by its Content-Length and while reading."""
        limit = self.args.max_body_bytes
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

    async def _parse(self, request: Request, model_cls):
        body = await self._read(request)
        raw = parse_json(body) if len(body) <= PARSE_INLINE_BYTES else await asyncio.to_thread(parse_json, body)
        try:
            return model_cls.model_validate(raw)
        except ValidationError as e:
            msg, loc = validation_message(e)
            raise RequestError(400, msg, loc) from None

    # ---- routing -------------------------------------------------------------------------------
    async def _vector(self, text: str, timings: dict):
        """The routing text's embedding: from the LRU (no thread hop, no batch) or the next encoder pass,
        shared with whatever else is queued (``EncoderBatcher``)."""
        t0 = time.perf_counter()
        key = self.embeddings.key(text)
        v = self.embeddings.get(key)
        timings["embedding_cache"] = "hit" if v is not None else "miss"
        if v is None:
            v, timings["encoder_batch"], timings["encode_ms"] = await self.batcher.encode(text)
            self.embeddings.put(key, v)
        timings["embed_ms"] = 1e3 * (time.perf_counter() - t0)
        return v

    async def _refusals(self, body: dict, endpoint: str) -> dict:
        """``{model: [parameters of ``body`` it cannot honour]}`` from each model's ``capabilities()``
        (asked once per model, the first time a routed request needs it)."""
        now = time.monotonic()
        missing = [m for m in self.routable if m not in self.caps and self.caps_retry.get(m, 0) <= now]
        if missing:  # a model that does not answer (not up yet) counts as capable; asked again in 30 s
            self.caps.update(await self.client.capabilities(missing, timeout_s=2.0))
            self.caps_retry.update({m: now + 30 for m in missing if m not in self.caps})
        return {m: refused_parameters(body, c[endpoint]) for m, c in self.caps.items()}

    async def _plan(self, req, body: dict, endpoint: str, timings: dict) -> planning.Plan:
        if req.model != ROUTER_MODEL:  # nothing router-related on a pass-through request's path
            return planning.pass_through(req.model, self.client.handles)
        t0 = time.perf_counter()
        text = routing_text(req, self.args.routing_text)
        if len(text) > self.args.max_prompt_chars:
            raise RequestError(413, f"the routing text has {len(text)} characters; the limit is "
                               f"{self.args.max_prompt_chars}", "messages" if isinstance(req, ChatRequest) else "prompt")
        router, path = self.router, self.router_path
        refusals = await self._refusals(body, endpoint)
        X = (await self._vector(text, timings))[None, :]
        t1 = time.perf_counter()
        acc, cost, outlier = router.estimate_with_outlier_score(X)  # one search for both
        timings["estimate_ms"] = 1e3 * (time.perf_counter() - t1)
        on_budget = self.budget is not None and req.proxray.lam is None
        lam = req.proxray.lam if req.proxray.lam is not None else self.budget.lam if on_budget else self.args.lam
        p = planning.routed(router.models_, self.client.handles, acc[0], cost[0], float(outlier[0]), lam,
                            req.proxray, path, refusals)
        if on_budget:
            if self.budget.basis == "estimated":  # known now; a realised cost when the answer is complete
                self.budget.observe(cost[0][router.models_.index(p.candidates[0])])
            p.on_budget, p.report["budget"] = True, self.budget.report()
        p.report["route_ms"] = 1e3 * (time.perf_counter() - t0)
        self.metrics.routed(p.report["route_ms"], p.report["outlier_score"])
        if self.monitor is not None:
            chosen = router.models_.index(p.candidates[0])
            self.monitor.report(text, X[0], objective(acc[0], cost[0], lam), chosen, p.report["outlier_score"])
        return p

    # ---- answering -----------------------------------------------------------------------------
    async def _first(self, req, body: dict, p: planning.Plan, endpoint: str, deadline: float):
        """Try the candidates in order until one gives a usable start: the whole response, or a stream's
        chunks up to its first content. Falls back on what another model can fix (errors, overload,
        timeouts); a model's 4xx about the request itself goes back to the client."""
        for model in p.candidates:
            gen = self.client.stream(model, endpoint, {**body, "model": model})
            head = []
            try:
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise asyncio.TimeoutError
                    obj = await asyncio.wait_for(gen.__anext__(), left)
                    if "error" in obj:
                        raise ModelError(obj)
                    head.append(obj)
                    if not req.stream or _has_content(obj):
                        break
            except StopAsyncIteration:
                pass  # a stream that ended before any content: complete as it is
            except ModelError as e:
                gen.cancel()
                if not e.retryable:
                    raise RequestError(e.status, e.obj["error"].get("message", ""), e.obj["error"].get("param"),
                                       e.obj["error"].get("type") or "invalid_request_error") from None
                self._failed(p, model, str(e))
                continue
            except Exception as e:  # noqa: BLE001 - replica died, overloaded, timed out: try the next
                gen.cancel()
                self._failed(p, model, failure_reason(e))
                if time.monotonic() >= deadline:
                    break
                continue
            if not head:
                self._failed(p, model, "the model returned nothing")
                continue
            p.report.update({"model": model, "fallback_from": [f["model"] for f in p.report.get("failures", [])]})
            p.report.setdefault("failures", [])
            if p.report.get("routed"):
                p.report["estimated_accuracy"] = p.report["estimates"][model]["accuracy"]
                p.report["estimated_cost"] = p.report["estimates"][model]["cost"]
            return model, head, gen
        failures = p.report.get("failures", [])
        if failures and all(f["error"] == "timeout" for f in failures) or time.monotonic() >= deadline:
            raise RequestError(504, f"no answer within timeout_s={self.args.timeout_s} s (tried "
                               f"{', '.join(f['model'] for f in failures)})", kind="timeout")
        raise RequestError(503, f"every candidate model failed: {failures}", kind="service_unavailable")

    def _failed(self, p, model, reason):
        logger.warning("proxray: model %s failed (%s); falling back", model, reason)
        p.report.setdefault("failures", []).append({"model": model, "error": reason})
        self.metrics.fallback(model)

    def _meter(self, p: planning.Plan, model: str):
        """How ``model``'s answer to plan ``p`` counts toward a budget on realised cost: a function of the answer's
        usage, or None where nothing is counted at the end (no budget, λ given by the request, or a budget on
        estimated cost, counted when routed). An answer without usage counts at its estimate."""
        if not p.on_budget or self.budget.basis != "realised":
            return None
        estimate = p.report["estimates"][model]["cost"]
        return lambda usage: self.budget.answered(model, usage, estimate)

    def _headers(self, report) -> dict:
        h = {"x-proxray-model": report["model"], "x-proxray-routed": str(report["routed"]).lower()}
        if report.get("routed"):
            h["x-proxray-outlier-score"] = f"{report['outlier_score']:.6f}"
            h["x-proxray-estimated-cost"] = f"{report['estimated_cost']:.6g}"
        if report["fallback_from"]:
            h["x-proxray-fallback-from"] = ",".join(report["fallback_from"])
        return h

    async def _handle(self, request: Request, model_cls, endpoint: str):
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.args.timeout_s
        timings = {}  # where the gateway's time went: parse, embed (+ cache), estimate, route, model
        try:
            self._check_auth(request)
            req = await self._parse(request, model_cls)
            body = req.forward(req.model, self.args.default_max_tokens)  # what every candidate gets, model aside
            timings["parse_ms"] = 1e3 * (time.perf_counter() - t0)
            p = await self._plan(req, body, endpoint, timings)
            t_model = time.perf_counter()
            model, head, gen = await self._first(req, body, p, endpoint, deadline)
            timings["model_ms"] = 1e3 * (time.perf_counter() - t_model)  # the answer, or a stream's first content
        except RequestError as e:
            self.metrics.error(e.status)
            return error_response(e)
        self.requests += 1
        self.metrics.answered(model, p.report["routed"])
        p.report["latency_s"] = time.perf_counter() - t0
        p.report["timings"] = timings
        meter = self._meter(p, model)
        if req.stream:
            head[0] = {**head[0], "proxray": p.report}
            usage = {}  # a stream's usage: in its last chunk, where the client asked for it (include_usage)

            def seen(obj):
                if obj.get("usage"):
                    usage["usage"] = obj["usage"]

            def done(ok):
                if not ok:  # a stream that ended in an error event
                    self.metrics.error(502)
                if meter:
                    meter(usage.get("usage"))

            return StreamingResponse(relay(head, gen, done, seen if meter else None), media_type="text/event-stream",
                                     headers=self._headers(p.report))
        if meter:
            meter(head[0].get("usage"))
        return JSONResponse({**head[0], "proxray": p.report}, headers=self._headers(p.report))

    # ---- routes (gateway_api binds them) ------------------------------------------------------
    def __serve_build_asgi_app__(self) -> FastAPI:
        return gateway_api(self, self.args)

    async def chat(self, request: Request):
        return await self._handle(request, ChatRequest, "chat")

    async def completions(self, request: Request):
        return await self._handle(request, CompletionRequest, "completions")

    def _model_objects(self) -> list:
        """OpenAI model objects: the router first, then every served model."""
        data = [{"id": ROUTER_MODEL, "object": "model", "created": self.created, "owned_by": "proxray",
                 "routes_to": self.routable}]
        return data + [{"id": m, "object": "model", "created": self.created, "owned_by": "proxray",
                        "engine": self.kinds[m]} for m in sorted(self.client.handles)]

    async def models(self, request: Request):
        try:
            self._check_auth(request)
        except RequestError as e:
            return error_response(e)
        return {"object": "list", "data": self._model_objects()}

    async def model(self, model: str, request: Request):
        try:
            self._check_auth(request)
            found = [m for m in self._model_objects() if m["id"] == model]
            if not found:
                raise planning.not_served(model, self.client.handles)
        except RequestError as e:
            return error_response(e)
        return found[0]

    async def health(self):
        return {"status": "ok", "models": sorted(self.client.handles), "router_models": self.routable,
                "requests": self.requests}


def _vllm_deployment(m: ServedModel, source: str):
    """A ray.serve.llm deployment for a vLLM model (``VLLMModelServer``: ``LLMServer`` with the gateway's
    ``respond``), named like every other model deployment and bound with its autoscaling and queue limits.
    GPU or CPU is the config's business (``placement_group_config`` bundles, ``accelerator_type``,
    ``engine_kwargs``, ``runtime_env``)."""
    from ray.serve.llm import LLMConfig, build_llm_deployment

    from proxray.pool.engines import vllm_engine_kwargs, vllm_placement
    from proxray.serve.vllm_server import VLLMModelServer

    cfg = LLMConfig(model_loading_config={"model_id": m.id, "model_source": source},
                    engine_kwargs=vllm_engine_kwargs(m), accelerator_type=m.accelerator_type,
                    deployment_config={"autoscaling_config": m.autoscaling.model_dump(exclude_none=True)},
                    **vllm_placement(m))
    # name_prefix="" falls back to "LLMServer:"; override_serve_options gives the plain name
    serve_options = {"name": deployment_name(m.id), "max_queued_requests": m.max_queued_requests}
    if m.max_ongoing_requests:
        serve_options["max_ongoing_requests"] = m.max_ongoing_requests
    return build_llm_deployment(cfg, override_serve_options=serve_options, deployment_cls=VLLMModelServer)


def check_models(a: AppArgs) -> dict:
    """What would fail inside a replica, checked when the app is built (before any replica starts):
    every problem at once. Returns ``{model id: source}`` with local folders made absolute."""
    from proxray.pool.engines import check_models as check

    sources, problems = check(a.models, a.default_max_tokens)
    if problems:
        raise ValueError("invalid app args:\n" + "\n".join(f"  {p}" for p in problems))
    return sources


def build_app(args: dict):
    """The Serve application: one deployment per model plus the router ingress."""
    a = AppArgs.model_validate(args)
    sources = check_models(a)
    handles = {}
    for m in a.models:
        if m.engine == "vllm":
            handles[m.id] = _vllm_deployment(m, sources[m.id])
        else:
            handles[m.id] = ModelServer.options(
                name=deployment_name(m.id), autoscaling_config=m.autoscaling.model_dump(exclude_none=True),
                ray_actor_options={"num_cpus": m.num_cpus, "num_gpus": m.num_gpus},
                max_ongoing_requests=m.max_ongoing_requests or 8, max_queued_requests=m.max_queued_requests,
            ).bind({**m.model_dump(), "source": sources[m.id] if m.engine == "transformers" else m.source})
    return RouterIngress.options(num_replicas=a.router_replicas, ray_actor_options={"num_cpus": a.router_num_cpus},
                                 max_ongoing_requests=a.router_max_ongoing_requests,
                                 max_queued_requests=a.router_max_queued_requests).bind(a.model_dump(), handles)
