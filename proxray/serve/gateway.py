"""The gateway's parts in one ingress replica, and what the request stages and the protocols' own routes ask of them.

``Gateway`` composes, from the app's args and the model handles: the encoder service, the routing policy (route or
pass through) over the router artifact, the model client (with liveness and the relays of endpoints it does not host),
readiness, the key gate, the conversations book, the answers kept for feedback, the stored responses, the model
listing, metrics and the monitor client. It holds no request: a request's state travels in its ``Flight``
(``proxray.serve.stages``). A protocol's own routes (``count_tokens``, the stored responses) get the gateway, never
the ingress.
"""
import logging
import time

from fastapi import Request
from ray import serve

from proxray.common.shared_actor import place_with
from proxray.common.tracing import enabled as tracing_enabled
from proxray.routing.index import single_thread
from proxray.serve import wire
from proxray.serve.config import ROUTER_MODEL, AppArgs, load_api_key, resolve_alias
from proxray.serve.deployments.client import ModelClient
from proxray.serve.deployments.endpoint_server import relays
from proxray.serve.deployments.liveness import Liveness
from proxray.serve.deployments.models import OpenAIModel
from proxray.serve.deployments.readiness import Readiness
from proxray.serve.errors import RequestError
from proxray.serve.metrics import GatewayMetrics
from proxray.serve.monitor_client import MonitorClient
from proxray.serve.protocols.base import Context
from proxray.serve.request import plan as planning
from proxray.serve.request.encoder_service import EncoderService
from proxray.serve.request.http import error_response, parse_request
from proxray.serve.request.model_list import ModelList
from proxray.serve.request.policy import RoutingPolicy, budget_from, request_policy
from proxray.serve.request.turn_cost import TurnFacts
from proxray.serve.tenancy.conversations import ConversationClient
from proxray.serve.tenancy.feedback import FeedbackClient, FeedbackRequest
from proxray.serve.tenancy.gate import KeyGate
from proxray.serve.tenancy.response_cache import ResponseCache
from proxray.serve.tenancy.responses import ResponseStore

logger = logging.getLogger("ray.serve")


def deployment_name(model_id: str) -> str:
    from proxray.common.naming import slug

    return slug(model_id)


class Gateway:
    """One ingress replica's parts (built once, from ``args`` and the model ``handles``) and the requests' shared
    steps: ``open`` (key, body, alias, policy), ``context`` (what a turn is given), ``plan`` (the router's decision)."""

    def __init__(self, args: dict, handles: dict, protocols: dict):
        from proxray.routing.registry import load_router

        self.args = a = AppArgs(**args)
        self.protocols = protocols  # {route: Protocol}
        self.encoder = EncoderService(a.encoder, a.encoder_backend, a.encoder_threads, a.embedding_cache_entries,
                                      a.embed_batch_wait_s)
        router = load_router(a.router, encoder_id=self.encoder.id)
        if not hasattr(router, "estimate_with_outlier_score"):
            raise ValueError(f"{a.router}: serving needs a KNNRouter or KMeansRouter artifact "
                             f"(it reports outlier scores), not a {type(router).__name__}")
        # an endpoint proxray does not host is relayed from this process; what it takes, per protocol it serves
        handles = relays(handles, lambda spec: {p.upstream: p.honoured() for p in protocols.values()
                                                if p.honoured is not None and spec.serves(p.name)})
        app_name = serve.get_replica_context().app_name
        deployments = {m: deployment_name(m) for m, h in handles.items() if not isinstance(h, OpenAIModel)}
        self.client = ModelClient(handles, Liveness(app_name, deployments, a.failover_s),
                                  salted=[m.id for m in a.models if m.engine == "vllm"])
        self.readiness = Readiness(app_name, deployments)  # /health: 503 until every model deployment has run
        self.policy = RoutingPolicy(router, a.router, handles, a.lam, budget_from(a), a.conversations,
                                    {m.id: m.price for m in a.models})
        place_with(a.router_resources)  # the app's shared actors where an ingress may run: off a head without them
        self.conversations = ConversationClient(app_name, a.conversations)
        self.answers = FeedbackClient(app_name, a.feedback)  # answers remembered for feedback on them
        # per protocol, the models whose endpoints serve it themselves (relayed as sent; the rest through chat)
        self.native = {p.name: {m.id for m in a.models if m.serves(p.name)} for p in protocols.values()}
        self.gate = KeyGate(a.keys_file, load_api_key(a), app_name, {m.id: m.price for m in a.models if m.price},
                            a.keys_ledger_shards, a.router_max_ongoing_requests)
        self.listing = ModelList(self.gate, self.policy.routable, self.client.handles,
                                 {m.id: m.engine for m in a.models})  # GET /v1/models, /v1/models/{model}
        self.replica = serve.get_replica_context().replica_id.unique_id  # which ingress replica answered
        self.metrics = GatewayMetrics()
        self.store = ResponseStore(app_name, a.responses)  # responses kept for retrieval and previous_response_id
        self.cache = ResponseCache(app_name, a.response_cache) if a.response_cache else None  # answers served once
        self.tracing = tracing_enabled()  # OpenTelemetry spans: only where the OTEL_* environment names an endpoint
        self.monitor = None
        if a.monitor:
            self.monitor = MonitorClient(a.monitor, a.reload_every_s, a.router, self.encoder.id, self.policy.use_router)

    async def open(self, request: Request, model_cls, timings: dict | None = None):
        """(key, the parsed request, its ``RequestPolicy``): the key identified (and refused where its rate refused
        it last, ``RateDoor``), the body read, bounded and validated as ``model_cls``, its model alias
        resolved, the request's policy decided once (app, alias, key, request) and the key's 403s applied."""
        key = self.gate.identify(request)
        self.gate.door.check(key)  # a key past its rate: refused before its body is read
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
        p.vector = X[0]  # the routing embedding: what the response cache's semantic lookup compares
        timings["estimate_ms"] = 1e3 * (time.perf_counter() - t1)
        p.report["route_ms"] = 1e3 * (time.perf_counter() - t0)
        self.metrics.routed(p.report["route_ms"], p.report["outlier_score"])
        if self.monitor is not None and not again:  # planned again (over a key's budget): reported once
            self.monitor.report(text, X[0], p.report["outlier_score"])
        return p

    def failed(self, model: str, reason: str) -> None:
        """A candidate failed before its answer's first content: the next one is asked."""
        logger.warning("proxray: model %s failed (%s); falling back", model, reason)
        self.metrics.fallback(model)

    async def estimate(self, text: str, model: str) -> float | None:
        """The router's estimated cost of ``model``'s answer to ``text`` (None where the router does not know it)."""
        router = self.policy.router
        if model not in router.models_ or len(text) > self.args.max_prompt_chars:
            return None
        _, cost, _ = router.estimate_with_outlier_score((await self.encoder.vector(text, {}))[None, :])
        return float(cost[0][router.models_.index(model)])

    # ---- the gateway's own routes (http.gateway_api binds them beside the protocols') -------------------------
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

    async def health(self):
        """For probes and load balancers, without a key (``Readiness.health``)."""
        return await self.readiness.health()

    async def close(self) -> None:
        """The replica is stopping (its requests drained): the keys' last charges sent and their leases given back."""
        if self.gate.ledger is not None:
            await self.gate.ledger.close()

    def counts(self) -> dict:
        """What this replica did for the requests it took: texts embedded, requests planned, bodies measured for their
        token bound, reports made to the monitor, and the served budget's requests counted and λ."""
        budget = self.policy.budget
        return {"embedded": self.encoder.asked, "planned": self.metrics.planned, "measured": wire.measured,
                "monitor_reports": self.monitor.reported if self.monitor is not None else 0,
                "budget_requests": budget.n if budget is not None else 0, "budget_lam": budget.lam if budget else None}
