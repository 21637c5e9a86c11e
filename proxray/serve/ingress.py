"""The ingress of the routed, OpenAI-compatible endpoint (``proxray.serve.builder`` checks the app's args and binds it
with one deployment per model; ``proxray.serve.app:build_app`` is the Serve config's import path).

    RouterIngress (FastAPI)  --DeploymentHandle.respond-->  ModelServer "<model a>"        (CPU engines)
      one request path for every protocol of the table      VLLMModelServer "<model b>"   (ray.serve.llm)
      (proxray.serve.protocols: chat, completions,          --in process-->  EndpointRelay "<model c>"
      Responses, Messages; each request a Turn), composing:   (an endpoint it does not host)
      HTTP boundary (http), encoder service, routing        ... every one: respond(upstream, body)
      policy (policy), model client (client) with
      fallback (fallback), stream writer (sse), monitor
      client, metrics

A request of any protocol crosses the same stages in the same order (``_handle``): open (key, body, alias, the
request's policy, the key's 403s), admit (the key's rate and budget, a hold of its body as sent: nothing else is done
for a request its key may not send), its protocol's turn (the one internal request every candidate is sent), plan (the
routing text embedded, the router's decision; the hold moved to the chosen model's), the candidates in order
(``first_answer``), then the answer or its stream, whose usage settles what it holds. The client's request goes to the
chosen model as sent (only ``model`` is rewritten) or, to a model whose endpoint does not serve its protocol,
translated to chat completions; the answer comes back in the client's protocol with a ``proxray`` object added (and
``x-proxray-*`` headers). ``args`` follow ``proxray.serve.config.AppArgs``. Handles are injected through
``.bind()``, so tests compose the same app from small real parts. Each ingress replica builds its FastAPI app from its
own args and the protocol table (``http.gateway_api``, Serve's late-bound ``__serve_build_asgi_app__``, as
ray.serve.llm's ``LLMServer`` does), so docs and CORS are per app.
"""

import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

from proxray.common.pricing import Usage
from proxray.common.shared_actor import place_with
from proxray.common.tracing import RequestTrace, enabled as tracing_enabled
from proxray.routing.index import single_thread
from proxray.serve.config import ROUTER_MODEL, AppArgs, load_api_key, resolve_alias
from proxray.serve.deployments.client import ModelClient
from proxray.serve.deployments.endpoint_server import relays
from proxray.serve.deployments.liveness import Liveness
from proxray.serve.deployments.models import OpenAIModel
from proxray.serve.deployments.readiness import Readiness
from proxray.serve.errors import RequestError
from proxray.serve.metrics import GatewayMetrics
from proxray.serve.monitor_client import MonitorClient
from proxray.serve.protocols import PROTOCOLS
from proxray.serve.protocols.base import Context
from proxray.serve.protocols.core import as_sent, output_limit
from proxray.serve.request import plan as planning
from proxray.serve.request.encoder_service import EncoderService
from proxray.serve.request.fallback import first_answer
from proxray.serve.request.http import error_response, gateway_api, parse_request, response_headers
from proxray.serve.request.model_list import ModelList
from proxray.serve.request.policy import RoutingPolicy, budget_from, request_policy
from proxray.serve.request.report import completed
from proxray.serve.request.sse import answer_stream
from proxray.serve.request.turn_cost import TurnFacts, turn_facts
from proxray.serve.tenancy.conversations import ConversationClient, billed, named
from proxray.serve.tenancy.feedback import FeedbackClient, FeedbackRequest
from proxray.serve.tenancy.gate import Held, KeyGate
from proxray.serve.tenancy.responses import ResponseStore

logger = logging.getLogger("ray.serve")


def deployment_name(model_id: str) -> str:
    from proxray.common.naming import slug

    return slug(model_id)


@serve.deployment
@serve.ingress()
class RouterIngress:
    """Composes, per request: the HTTP boundary (bound, parse, key), the routing policy (route or pass through)
    over the encoder service's embedding, the model client with fallback, and the answer or its stream."""

    def __init__(self, args: dict, handles: dict, protocols: dict | None = None, families: tuple = ()):
        from proxray.routing.registry import load_router, register

        for family in families:  # router families beside the shipped ones (``build``'s)
            register(family)
        self.args = a = AppArgs(**args)
        self.protocols = PROTOCOLS if protocols is None else protocols  # {route: Protocol}
        self.encoder = EncoderService(a.encoder, a.encoder_backend, a.encoder_threads, a.embedding_cache_entries,
                                      a.embed_batch_wait_s)
        router = load_router(a.router, encoder_id=self.encoder.id)
        if not hasattr(router, "estimate_with_outlier_score"):
            raise ValueError(f"{a.router}: serving needs a KNNRouter or KMeansRouter artifact "
                             f"(it reports outlier scores), not a {type(router).__name__}")
        # an endpoint proxray does not host is relayed from this process; what it takes, per protocol it serves
        handles = relays(handles, lambda spec: {p.upstream: p.honoured() for p in self.protocols.values()
                                                if p.honoured is not None and spec.serves(p.name)})
        app_name = serve.get_replica_context().app_name
        deployments = {m: deployment_name(m) for m, h in handles.items() if not isinstance(h, OpenAIModel)}
        self.client = ModelClient(handles, Liveness(app_name, deployments, a.failover_s))
        self.readiness = Readiness(app_name, deployments)  # /health: 503 until every model deployment has run
        self.policy = RoutingPolicy(router, a.router, handles, a.lam, budget_from(a), a.conversations,
                                    {m.id: m.price for m in a.models})
        place_with(a.router_resources)  # the app's shared actors where an ingress may run: off a head without them
        self.conversations = ConversationClient(app_name, a.conversations)
        self.answers = FeedbackClient(app_name, a.feedback)  # answers remembered for feedback on them
        # per protocol, the models whose endpoints serve it themselves (relayed as sent; the rest through chat)
        self.native = {p.name: {m.id for m in a.models if m.serves(p.name)} for p in self.protocols.values()}
        self.gate = KeyGate(a.keys_file, load_api_key(a), app_name, {m.id: m.price for m in a.models if m.price},
                            a.keys_ledger_shards)
        self.listing = ModelList(self.gate, self.policy.routable, self.client.handles,
                                 {m.id: m.engine for m in a.models})  # GET /v1/models, /v1/models/{model}
        self.replica = serve.get_replica_context().replica_id.unique_id  # which ingress replica answered
        self.metrics = GatewayMetrics()
        self.store = ResponseStore(app_name, a.responses)  # responses kept for retrieval and previous_response_id
        self.tracing = tracing_enabled()  # OpenTelemetry spans: only where the OTEL_* environment names an endpoint
        self.monitor = None
        if a.monitor:
            self.monitor = MonitorClient(a.monitor, a.reload_every_s, a.router, self.encoder.id, self.policy.use_router)

    # ---- the stages every protocol's request crosses (a protocol's own routes use them too) -------------------
    async def open(self, request: Request, model_cls, timings: dict | None = None):
        """(key, the parsed request, its ``RequestPolicy``): the key identified, the body read, bounded and validated
        as ``model_cls``, its model alias resolved, the request's policy decided once (app, alias, key, request) and
        the key's 403s applied."""
        key = self.gate.identify(request)
        req = await parse_request(request, model_cls, self.args.max_body_bytes, timings)
        req.model, alias = resolve_alias(req.model, self.args.model_aliases)
        rp = request_policy(req.proxray, key, request.headers, alias)
        self.gate.check_policy(key, req.model, rp)
        return key, req, rp

    def context(self, protocol, key, headers) -> Context:
        """What a turn of ``protocol`` is given of the app for one request of ``key``."""
        return Context(protocol, self.client, self.native[protocol.name], self.args, self.store, key and key.owner,
                       headers)

    async def plan(self, req, rp, turn, timings: dict, text: str, key=None, again: bool = False,
                   facts: TurnFacts | None = None) -> planning.Plan:
        """The request's plan: a named model's, or the router's decision over its routing text's embedding (the
        models' refusals, the conversation's model, the key's visible evidence); reported to the monitor unless
        ``again`` (a count planned as its request would be)."""
        if req.model != ROUTER_MODEL:  # nothing router-related on a pass-through request's path
            return planning.pass_through(req.model, self.client.handles)
        t0 = time.perf_counter()
        if len(text) > self.args.max_prompt_chars:
            raise RequestError(413, f"the routing text has {len(text)} characters; the limit is "
                               f"{self.args.max_prompt_chars}", turn.param)
        refusals = await turn.client.refusals(self.policy.routable, turn.body, turn.upstream)
        X = (await self.encoder.vector(text, timings, key.owner if key else ""))[None, :]
        # the model of the conversation's last turn (a stored response's, or the book's with what it cached where)
        previous, session = await self.conversations.look_up(turn.previous, rp.conversation, key and key.owner, timings)
        t1 = time.perf_counter()
        single_thread()  # one query, one faiss thread (more threads cost more than they give on one query)
        p = self.policy.decide(X, rp, refusals, previous, self.gate.rules.visible(key), turn.tool_loop, session,
                               facts)
        p.candidates = self.client.liveness.order(p.candidates)  # those lost or slow to take requests tried last
        timings["estimate_ms"] = 1e3 * (time.perf_counter() - t1)
        p.report["route_ms"] = 1e3 * (time.perf_counter() - t0)
        self.metrics.routed(p.report["route_ms"], p.report["outlier_score"])
        if self.monitor is not None and not again:  # planned again (over a key's budget): reported once
            self.monitor.report(text, X[0], p.report["outlier_score"])
        return p

    def _failed(self, model: str, reason: str) -> None:
        logger.warning("proxray: model %s failed (%s); falling back", model, reason)
        self.metrics.fallback(model)

    async def _estimate(self, text: str, model: str) -> float | None:
        """The router's estimated cost of ``model``'s answer to ``text`` (None where the router does not know it)."""
        router = self.policy.router
        if model not in router.models_ or len(text) > self.args.max_prompt_chars:
            return None
        _, cost, _ = router.estimate_with_outlier_score((await self.encoder.vector(text, {}))[None, :])
        return float(cost[0][router.models_.index(model)])

    def endpoint(self, protocol):
        """The FastAPI endpoint of ``protocol``'s route: the one request path (``_handle``)."""
        async def handle(request: Request):
            return await self._handle(request, protocol)

        handle.__name__ = handle.__qualname__ = protocol.name  # the route's name in /docs
        return handle

    async def _handle(self, request: Request, protocol):
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.args.timeout_s
        timings = {}  # where the gateway's time went: read, parse, embed (+ cache), estimate, model
        key, held, p, slot = None, None, None, None
        trace = RequestTrace(request.headers, protocol.name, self.tracing)  # nothing where tracing is off
        try:
            key, req, rp = await self.open(request, protocol.request, timings)
            trace.requested(req.model, output_limit(req))
            slot = self.gate.enter(key)  # one of the key's requests in flight on this replica, until the answer ends
            # admission before any work on the request (history, embedding, plan, the budget's λ, the monitor's
            # report): the key's rate, and a hold of its body as sent at the dearest model it may reach
            held = Held(self.gate, key)  # the key's hold on its budget, settled exactly once
            routed = req.model == ROUTER_MODEL
            key_report, past, first_hold = await self.gate.admit_request(
                key, lambda: as_sent(req, self.args.default_max_tokens), held.take,
                self.policy.reach(rp) if routed else [req.model], routed, self.client.handles)
            if past:  # over a ``cheapest`` budget: cost decides its plan
                rp = rp.over_budget()
            self.client.salt(key.owner[:32] if key is not None else "")  # its prompt-cache salt, for models that take one
            # the body every candidate gets (model aside), in the protocol or as the one internal request
            turn = await protocol.begin(req, self.context(protocol, key, request.headers))
            rp = named(rp, turn.previous_id, turn.session)  # the conversation the turn continues, if any
            self.client.session(rp.conversation, key.owner if key is not None else "")  # its replica, co-hosted
            timings["parse_ms"] = 1e3 * (time.perf_counter() - t0) - timings["read_ms"]  # the CPU work after it
            text = turn.text(self.args.routing_text)
            facts = turn_facts(turn.body, self.native[protocol.name], self.policy.routable) \
                if rp.conversation is not None and routed else None
            p = await self.plan(req, rp, turn, timings, text, key, facts=facts)
            trace.routed(p.report, p.candidates[0] if p.candidates else None)
            p, estimate = await self.gate.hold_plan(  # the hold moved to the chosen model's bound on the whole turn
                key, key_report, p, turn.body, held.ticket, first_hold, lambda m: self._estimate(text, m),
                self.client.handles, replan=lambda: self.plan(req, rp.over_budget(), turn, timings, text, key,
                                                               again=True))
            t_model = time.perf_counter()
            trace.calling()  # its traceparent goes to an endpoint relayed from here
            model, head, gen = await first_answer(turn.client, p, turn.body, turn.upstream, req.stream, deadline,
                                                  self.args.timeout_s, self._failed, turn.has_content)
            timings["model_ms"] = 1e3 * (time.perf_counter() - t_model)  # the answer, or a stream's first content
        except RequestError as e:
            if held is not None:  # no answer: nothing spent, unless a model had it past the deadline (a 504)
                held.refused(e.status, p, turn.body if p is not None else None)
            if slot is not None:
                slot.release()
            self.metrics.error(e.status)
            trace.failed(e.status, e.message)
            return error_response(e, protocol.error)
        except BaseException as e:  # an unexpected failure, or the client gone before the answer: nothing spent
            trace.failed(500, type(e).__name__)
            if held is not None:
                held.release()
            if slot is not None:
                slot.release()
            raise
        self.metrics.answered(model, p.report["routed"])
        told = None  # the model that answered carries the conversation on, and its prompt in its cache
        if p.report.get("conversation") and turn.previous_id is None:
            told = self.conversations.carry_on(p.report["conversation"]["id"], model, key and key.owner, facts)
        completed(p.report, time.perf_counter() - t0, timings, self.replica, gen, key_report, key is not None)
        # what an answer's usage counts toward: a budget on realised cost, the key's spend
        # and the answer, remembered for feedback on it
        if model != p.candidates[0] or estimate is None:
            estimate = p.report.get("estimates", {}).get(model, {}).get("cost", estimate)
        counts = [f for f in (self.policy.meter(p, model), held.charger(model, estimate, turn.body),
                              self.answers.recorder(turn.answer_id(head[0]), text, model, key and key.owner,
                                                    self.gate.prices.get(model), estimate)
                              if len(text) <= self.args.max_prompt_chars else None, slot.release,
                              trace.finisher(model, p.report, self.gate.prices.get(model), estimate), told) if f]
        relayed = self.client.relayed(model)
        # a hosted provider's prompt cache is shared by every key of the gateway: a key is not shown its cache reads
        # (another key's prefix would be a hit it could see); co-hosted models keep each key's apart (cache_salt)
        view = Usage.without_cache_reads if key is not None and relayed else None
        if view is None and not req.stream:  # a whole answer's report: what its cache reads were billed
            billed(p.report, turn.usage(head[0]))
        if req.stream:
            events = await answer_stream(turn, head, gen, p.report, counts, lambda: self.metrics.error(502),
                                         read_on_until=deadline if relayed else None, view=view)
            return StreamingResponse(events, media_type="text/event-stream", headers=response_headers(p.report))
        for count in counts:
            count(turn.usage(head[0]))
        shown = view(head[0]) if view is not None else head[0]
        return JSONResponse(await turn.answer(shown, p.report), headers=response_headers(p.report))

    # ---- the gateway's own routes (http.gateway_api binds them beside the protocols') -------------------------
    def __serve_build_asgi_app__(self) -> FastAPI:
        return gateway_api(self, self.args, self.protocols)

    async def feedback(self, request: Request):
        """``POST /v1/feedback``: a score in [0, 1] for an answer this endpoint gave (proxray.serve.tenancy.feedback)."""
        try:
            key = self.gate.identify(request)
            self.answers.check_enabled()
            await self.gate.admit(key, 0.0, None, budget=False)  # a feedback post counts toward the key's rate
            fb = await parse_request(request, FeedbackRequest, self.args.max_body_bytes)
            trains, source = self.gate.rules.feedback(key)  # 403 for a key that may not send feedback
            return await self.answers.take(fb, key and key.owner, self.metrics, self.monitor, trains=trains,
                                           source=source)
        except RequestError as e:
            self.metrics.error(e.status)
            return error_response(e)

    def counts(self) -> dict:
        """What this replica did for the requests it took (through a Serve handle, for operators' tools and tests;
        never over HTTP): texts embedded, requests planned, reports made to the monitor, and the served budget's
        requests counted and λ."""
        budget = self.policy.budget
        return {"embedded": self.encoder.asked, "planned": self.metrics.planned,
                "monitor_reports": self.monitor.reported if self.monitor is not None else 0,
                "budget_requests": budget.n if budget is not None else 0, "budget_lam": budget.lam if budget else None}

    async def health(self):
        """For probes and load balancers, without a key (``Readiness.health``)."""
        return await self.readiness.health()
