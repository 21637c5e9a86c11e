"""The routed, OpenAI-compatible endpoint as one Ray Serve application.

    RouterIngress (FastAPI)  --DeploymentHandle-->  ModelServer "<model a>"   (autoscaled)
        router artifact + encoder                   ModelServer "<model b>"   (autoscaled)
                                                    vLLM LLMServer "<model c>" (ray.serve.llm, GPU)

``build_app(args)`` is the ``import_path`` target (``proxray.serve.app:build_app``); ``args`` follow
``proxray.serve.schemas.AppArgs``. Handles are injected through ``.bind()``, so tests compose the same
app from small real parts.
"""

import asyncio
import hmac
import json
import logging
import os
import time
import uuid

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from ray import serve

from ..engines import Sampling, make_engine
from .schemas import ROUTER_MODEL, AppArgs, ChatRequest, CompletionRequest, ServedModel

logger = logging.getLogger("ray.serve")


def deployment_name(model_id: str) -> str:
    from ..evaljob import slug

    return slug(model_id)


@serve.deployment
class ModelServer:
    """One pool model behind the CPU engines (sim, transformers). ``generate`` runs the engine in a
    worker thread so a replica keeps accepting requests (what the autoscaler counts)."""

    def __init__(self, spec: dict):
        self.spec = ServedModel(**spec)
        self.engine = make_engine(self.spec)

    async def generate(self, prompt: str, max_tokens: int, temperature: float, seed: int) -> dict:
        row = {"query_id": uuid.uuid4().hex, "task": "live", "prompt": prompt}
        out = await asyncio.to_thread(self.engine.generate, [row], Sampling(temperature, max_tokens, seed))
        return out[0]


class HTTPError(Exception):
    def __init__(self, status: int, message: str, param=None, kind: str = "invalid_request_error"):
        self.status, self.message, self.param, self.kind = status, message, param, kind


def error_response(e: HTTPError) -> JSONResponse:
    return JSONResponse({"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.status}},
                        status_code=e.status)


def _validation_message(err: ValidationError) -> tuple[str, str | None]:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or None
    msgs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in err.errors()[:5])
    return msgs, loc


api = FastAPI(title="proxray", description="OpenAI-compatible endpoint routed by ProxRouter")


@serve.deployment
@serve.ingress(api)
class RouterIngress:
    """Routes each request with the fitted router and dispatches it to the chosen model deployment;
    falls back to the next-best model when that one errors or times out."""

    def __init__(self, args: dict, handles: dict):
        from ..artifact import load_router
        from ..embed import SentenceEncoder

        self.args = AppArgs(**args)
        self.encoder = SentenceEncoder(self.args.encoder, cache=False, progress=False)
        self.encoder.encode(["warm-up"])  # load the encoder now, not on the first request
        self.router = load_router(self.args.router, encoder_id=self.encoder.id)
        if not hasattr(self.router, "estimate_with_outlier_score"):
            raise ValueError(f"{self.args.router}: serving needs a KNNRouter or KMeansRouter artifact "
                             f"(it reports outlier scores), not a {type(self.router).__name__}")
        self.handles = handles  # model id -> DeploymentHandle
        self.kinds = {m.id: m.engine for m in self.args.models}
        self.routable = [m for m in self.router.models_ if m in handles]
        if not self.routable:
            raise ValueError(f"none of the router's models {self.router.models_} is served ({sorted(handles)})")
        key_env = self.args.api_key_env
        self.api_key = os.environ.get(key_env, "").encode() if key_env else b""
        if key_env and not self.api_key:
            raise ValueError(f"api_key_env={key_env!r} is set but the environment variable is empty")
        self.requests = 0
        self.router_path = self.args.router
        self.monitor = None
        if self.args.monitor:
            import ray

            self.monitor = ray.get_actor(self.args.monitor, namespace="proxray")
        self._watcher = None

    # ---- plumbing ----------------------------------------------------------------------------
    def _check_auth(self, request: Request) -> None:
        if not self.api_key:
            return
        header = request.headers.get("authorization", "")
        token = header[7:].encode() if header.lower().startswith("bearer ") else b""
        if not hmac.compare_digest(token, self.api_key):  # constant time; the key is never logged
            raise HTTPError(401, "missing or invalid API key (Authorization: Bearer …)", kind="authentication_error")

    async def _parse(self, request: Request, model_cls):
        body = await request.body()
        try:
            raw = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HTTPError(400, f"body is not valid JSON: {e}") from None
        if not isinstance(raw, dict):
            raise HTTPError(400, "body must be a JSON object")
        try:
            req = model_cls.model_validate(raw)
        except ValidationError as e:
            msg, loc = _validation_message(e)
            raise HTTPError(400, msg, loc) from None
        return req

    # ---- drift monitor ------------------------------------------------------------------------
    async def _watch_router(self):
        """Switch to the monitor's newest router artifact: load it off the event loop, then swap the
        reference in one assignment, so requests in flight finish on the old router, none is dropped."""
        from ..artifact import load_router

        while True:
            await asyncio.sleep(self.args.reload_every_s)
            try:
                path = (await self.monitor.status.remote())["router_path"]
                if path != self.router_path:
                    new = await asyncio.to_thread(load_router, path, None, self.encoder.id)
                    self.router, self.router_path = new, path
                    logger.info("proxray: switched to router %s (%d training queries)", path, new.n_train_)
            except Exception as e:  # noqa: BLE001 - the monitor is optional; serving goes on
                logger.warning("proxray: router watch failed: %s", e)

    def _report(self, prompt, X, acc_hat, cost_hat, lam, chosen_index, outlier):
        """Fire and forget: the request never waits for the monitor."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch_router())
        self.monitor.report.remote(uuid.uuid4().hex, prompt, X[0], (acc_hat - lam * cost_hat).tolist(),
                                   chosen_index, outlier)

    # ---- routing -----------------------------------------------------------------------------
    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002)
    async def _embed(self, prompts: list) -> list:
        """Concurrent requests share one encoder forward pass (the encoder is most of the routing
        cost); it runs in a thread so the replica keeps accepting requests meanwhile."""
        X = await asyncio.to_thread(self.encoder.encode, prompts)
        return list(X)

    async def _route(self, req, prompt: str):
        """Candidates in preference order and the routing report."""
        if len(prompt) > self.args.max_prompt_chars:
            raise HTTPError(413, f"prompt has {len(prompt)} characters; the limit is {self.args.max_prompt_chars}",
                            "messages" if isinstance(req, ChatRequest) else "prompt")
        opts = req.proxray
        if req.model != ROUTER_MODEL:
            if req.model not in self.handles:
                raise HTTPError(404, f"model {req.model!r} is not served; use {ROUTER_MODEL!r} for routing or one of: "
                                f"{', '.join(sorted(self.handles))}", "model", "not_found_error")
            return [req.model], {"routed": False}
        models = self.router.models_
        allowed = np.array([m in self.handles for m in models])
        if opts.allowed_models is not None:
            unknown = sorted(set(opts.allowed_models) - set(self.routable))
            if unknown:
                raise HTTPError(400, f"proxray.allowed_models: {unknown} are not routable models "
                                f"({', '.join(self.routable)})", "proxray.allowed_models")
            allowed &= np.array([m in opts.allowed_models for m in models])
        X = (await self._embed(prompt))[None, :]
        acc_hat, cost_hat, outlier = self.router.estimate_with_outlier_score(X)  # one search for both
        acc_hat, cost_hat, outlier = acc_hat[0], cost_hat[0], float(outlier[0])
        if opts.max_cost is not None:
            fits = cost_hat <= opts.max_cost
            if not (allowed & fits).any():
                cheapest = float(cost_hat[allowed].min())
                raise HTTPError(400, f"proxray.max_cost={opts.max_cost}: no allowed model is estimated that cheap "
                                f"(cheapest: {cheapest:.3g} USD)", "proxray.max_cost")
            allowed &= fits
        lam = self.args.lam if opts.lam is None else opts.lam
        u = np.where(allowed, acc_hat - lam * cost_hat, -np.inf)
        order = [int(i) for i in np.lexsort((cost_hat, -u)) if allowed[i]]  # best utility, then cheaper
        if self.monitor is not None:
            self._report(prompt, X, acc_hat, cost_hat, lam, order[0] if order else -1, outlier)
        report = {"routed": True, "lam": lam, "outlier_score": outlier, "router_path": self.router_path,
                  "estimates": {models[i]: {"accuracy": float(acc_hat[i]), "cost": float(cost_hat[i])} for i in order}}
        report["runner_up"] = models[order[1]] if len(order) > 1 else None
        return [models[i] for i in order], report

    async def _call(self, model: str, prompt: str, req) -> dict:
        max_tokens = req.max_tokens or self.args.default_max_tokens
        seed = 42 if req.seed is None else req.seed
        if self.kinds.get(model) == "vllm":
            return await self._call_vllm(model, prompt, req, max_tokens, seed)
        return await self.handles[model].generate.remote(prompt, max_tokens, req.temperature, seed)

    async def _call_vllm(self, model, prompt, req, max_tokens, seed) -> dict:
        """ray.serve.llm's LLMServer: ``chat(request)`` yields the OpenAI response (2.60 API)."""
        from ray.serve.llm.openai_api_models import ChatCompletionRequest

        r = ChatCompletionRequest(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                                  temperature=req.temperature, seed=seed, stream=False)
        async for item in self.handles[model].options(stream=True).chat.remote(r):
            body = item.model_dump() if hasattr(item, "model_dump") else item
            if isinstance(body, dict) and "choices" in body:
                usage = body.get("usage") or {}
                return {"response": body["choices"][0]["message"]["content"] or "",
                        "input_tokens": int(usage.get("prompt_tokens", 0)),
                        "output_tokens": int(usage.get("completion_tokens", 0))}
            raise RuntimeError(f"vLLM deployment {model} answered {str(body)[:200]}")
        raise RuntimeError(f"vLLM deployment {model} returned nothing")

    async def _answer(self, req, prompt: str):
        t0 = time.perf_counter()
        candidates, report = await self._route(req, prompt)
        report["route_ms"] = 1e3 * (time.perf_counter() - t0)
        failures = []
        for model in candidates:
            try:
                out = await asyncio.wait_for(self._call(model, prompt, req), timeout=self.args.timeout_s)
                report.update({"model": model, "fallback_from": [f["model"] for f in failures], "failures": failures})
                if report.get("routed"):
                    report["estimated_accuracy"] = report["estimates"][model]["accuracy"]
                    report["estimated_cost"] = report["estimates"][model]["cost"]
                return out, report
            except Exception as e:  # noqa: BLE001 - any failure of one model: try the next
                cause = getattr(e, "cause", None) or e  # a RayTaskError wraps the replica's exception
                reason = "timeout" if isinstance(e, asyncio.TimeoutError) else f"{type(cause).__name__}: {str(cause)[:200]}"
                logger.warning("proxray: model %s failed (%s); falling back", model, reason)
                failures.append({"model": model, "error": reason})
        raise HTTPError(503, f"every candidate model failed: {failures}", kind="service_unavailable")

    def _headers(self, report) -> dict:
        h = {"x-proxray-model": report["model"], "x-proxray-routed": str(report["routed"]).lower()}
        if report.get("routed"):
            h["x-proxray-outlier-score"] = f"{report['outlier_score']:.6f}"
            h["x-proxray-estimated-cost"] = f"{report['estimated_cost']:.6g}"
        if report["fallback_from"]:
            h["x-proxray-fallback-from"] = ",".join(report["fallback_from"])
        return h

    async def _handle(self, request: Request, model_cls, kind: str):
        t0 = time.perf_counter()
        try:
            self._check_auth(request)
            req = await self._parse(request, model_cls)
            prompt = req.prompt() if kind == "chat" else req.prompt
            out, report = await self._answer(req, prompt)
        except HTTPError as e:
            return error_response(e)
        self.requests += 1
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        usage = {"prompt_tokens": out["input_tokens"], "completion_tokens": out["output_tokens"],
                 "total_tokens": out["input_tokens"] + out["output_tokens"]}
        report["latency_s"] = time.perf_counter() - t0
        created = int(time.time())
        if req.stream:
            return StreamingResponse(self._sse(rid, created, report, out, usage, kind), media_type="text/event-stream",
                                     headers=self._headers(report))
        if kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": out["response"]}, "finish_reason": "stop"}
        else:
            choice = {"index": 0, "text": out["response"], "finish_reason": "stop", "logprobs": None}
        body = {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion", "created": created,
                "model": report["model"], "choices": [choice], "usage": usage, "proxray": report}
        return JSONResponse(body, headers=self._headers(report))

    async def _sse(self, rid, created, report, out, usage, kind):
        """Server-sent events in OpenAI's chunk format. The answer is generated (with fallback) first,
        then sent in pieces: a failing model can still be replaced before the first byte."""
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        words = out["response"].split(" ")
        pieces = [w if i == 0 else " " + w for i, w in enumerate(words)] or [""]
        for i, piece in enumerate(pieces):
            if kind == "chat":
                delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
                choice = {"index": 0, "delta": delta, "finish_reason": None}
            else:
                choice = {"index": 0, "text": piece, "finish_reason": None}
            yield f"data: {json.dumps({'id': rid, 'object': obj, 'created': created, 'model': report['model'], 'choices': [choice]})}\n\n"
        last = {"index": 0, "delta": {}, "finish_reason": "stop"} if kind == "chat" else {"index": 0, "text": "", "finish_reason": "stop"}
        yield f"data: {json.dumps({'id': rid, 'object': obj, 'created': created, 'model': report['model'], 'choices': [last], 'usage': usage, 'proxray': report})}\n\n"
        yield "data: [DONE]\n\n"

    # ---- routes ------------------------------------------------------------------------------
    @api.post("/v1/chat/completions")
    async def chat(self, request: Request):
        return await self._handle(request, ChatRequest, "chat")

    @api.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._handle(request, CompletionRequest, "completion")

    @api.get("/v1/models")
    async def models(self, request: Request):
        try:
            self._check_auth(request)
        except HTTPError as e:
            return error_response(e)
        data = [{"id": ROUTER_MODEL, "object": "model", "owned_by": "proxray", "routes_to": self.routable}]
        data += [{"id": m, "object": "model", "owned_by": "proxray", "engine": self.kinds[m]} for m in sorted(self.handles)]
        return {"object": "list", "data": data}

    @api.get("/health")
    async def health(self):
        return {"status": "ok", "models": sorted(self.handles), "router_models": self.routable, "requests": self.requests}


def _vllm_deployment(m: ServedModel, source: str):
    """A ray.serve.llm deployment (``LLMServer``) for a vLLM model, named like every other model
    deployment and bound with its autoscaling config. GPU or CPU is the config's business
    (``placement_group_config`` bundles, ``accelerator_type``, ``engine_kwargs``, ``runtime_env``)."""
    from ray.serve.llm import LLMConfig, build_llm_deployment

    from ..engines import vllm_engine_kwargs

    extra = {"placement_group_config": m.placement_group_config} if m.placement_group_config else {}
    if m.runtime_env:
        extra["runtime_env"] = m.runtime_env
    cfg = LLMConfig(model_loading_config={"model_id": m.id, "model_source": source},
                    engine_kwargs=vllm_engine_kwargs(m), accelerator_type=m.accelerator_type,
                    deployment_config={"autoscaling_config": m.autoscaling.model_dump(exclude_none=True)}, **extra)
    # name_prefix="" falls back to "LLMServer:"; override_serve_options gives the plain name
    return build_llm_deployment(cfg, override_serve_options={"name": deployment_name(m.id)})


def check_models(a: AppArgs) -> dict:
    """What would fail inside a replica, checked when the app is built (before any replica starts):
    every problem at once. Returns ``{model id: source}`` with local folders made absolute."""
    from ..engines import check_models as check

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
            ).bind({**m.model_dump(), "source": sources[m.id] if m.engine == "transformers" else m.source})
    return RouterIngress.options(num_replicas=a.router_replicas,
                                 ray_actor_options={"num_cpus": a.router_num_cpus}).bind(a.model_dump(), handles)
