"""The model client: calls a model the same way for every engine (``respond(endpoint, body)``, see
``proxray.serve.deployments.models``) — a deployment through its handle, an endpoint relayed in this process
(``proxray.serve.deployments.endpoint_server.EndpointRelay``) directly — and sorts out which failures another model could fix
(fall back) from those that belong to the request (answer the client)."""
from __future__ import annotations

import asyncio
import contextvars
import time

from proxray.common.secrets import scrub
from proxray.pool.upstream import error_status, falls_back  # one module: what a model's status means
from proxray.serve.deployments.liveness import HEARTBEAT_S, Liveness, Unavailable, WatchedStream
from proxray.serve.deployments.models import OpenAIModel, refused_parameters
from proxray.serve.errors import error
from proxray.serve.wire import reached

def failure_reason(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    cause = getattr(e, "cause", None) or e  # a RayTaskError wraps the replica's exception
    return f"{type(cause).__name__}: {scrub(str(cause), 200, local=True)}"


class ModelError(Exception):
    """A model answered with an OpenAI error object; ``falls_back`` when another model could do better."""

    def __init__(self, obj: dict):
        err = obj.get("error") or {}
        self.status = error_status(err)
        self.obj = error(self.status, scrub(err.get("message", ""), 2000, local=True), err.get("param"),
                         err.get("type") or "server_error")
        self.falls_back = falls_back(self.status)
        # the parameter of the request the model says it cannot take (a routed request asks the next model)
        self.unsupported = err.get("param") if err.get("unsupported") and self.status == 400 else None
        super().__init__(f"{self.status} {err.get('type')}: {scrub(err.get('message', ''), 200, local=True)}")


class LocalStream:
    """An in-process model's ``respond`` stream, with ``cancel()`` as a deployment's stream has it."""

    def __init__(self, gen):
        self.gen = gen

    def __aiter__(self):
        return self

    def __anext__(self):
        return self.gen.__anext__()

    async def done(self) -> None:
        """A whole answer was taken: the stream closed now, so the relay's slot and connection go back with the
        answer, not when the garbage collector finds the request."""
        await self.gen.aclose()

    def cancel(self) -> None:
        """Close the stream (the relay's request to its endpoint with it), soon, from the running loop."""
        async def close():
            try:
                await self.gen.aclose()
            except RuntimeError:  # still running: it ends with the task that runs it
                pass

        asyncio.get_running_loop().create_task(close())


# The asking key's prompt-cache salt for this request (set by the ingress; "" for the app's own key): a co-hosted model
# that takes ``cache_salt`` (vLLM) is sent it, so one key's prefixes are never another key's cache hits and the
# cached-token counts a key is shown are its own.
TENANT: contextvars.ContextVar = contextvars.ContextVar("proxray_tenant", default="")
CACHE_SALT = "cache_salt"
# The request's conversation, as its co-hosted models' request router reads it (Serve's ``session_id``): a vLLM
# deployment's turns of one conversation go to the replica whose prefix cache holds it ("" for none).
SESSION: contextvars.ContextVar = contextvars.ContextVar("proxray_session", default="")


class ModelClient:
    ASK_AGAIN_S = 30.0  # a model that did not say its capabilities (not up yet) is asked again after this

    def __init__(self, handles: dict, liveness: Liveness | None = None, salted=()):
        self.handles = handles  # model id -> DeploymentHandle or in-process OpenAIModel (every one with ``respond``)
        # the models the app built on an engine that takes ``cache_salt`` (vLLM): salted from the first request, before
        # they say their capabilities
        self.salted = frozenset(salted)
        self.liveness = liveness or Liveness(None, {}, 1.0)  # which deployments have a live replica
        for callee in handles.values():  # a relay that takes its model out tells the liveness every request reads
            if isinstance(callee, OpenAIModel) and hasattr(callee, "on_out"):
                callee.on_out = self.liveness.take_out
        self.caps: dict = {}  # model id -> {endpoint: frozenset of parameters it honours}, asked lazily
        self.caps_retry: dict = {}  # model id -> when to ask again a model that did not answer

    def relayed(self, model: str) -> bool:
        """Whether ``model`` is an endpoint relayed from this process (its provider bills each answer), not a
        deployment the app hosts."""
        return isinstance(self.handles.get(model), OpenAIModel)

    @staticmethod
    def salt(value: str) -> None:
        """The asking key's prompt-cache salt for the rest of this request (``TENANT``; "" for none)."""
        TENANT.set(value)

    @staticmethod
    def session(conversation: str | None, tenant: str = "") -> None:
        """The request's conversation for the rest of this request (``SESSION``): an opaque digest of the key and the
        conversation id, so a deployment's request router keeps its turns on one replica."""
        import hashlib

        SESSION.set(hashlib.sha256(f"{tenant}\x00{conversation}".encode()).hexdigest()[:32] if conversation else "")

    def stream(self, model: str, endpoint: str, body: dict, patient: bool = True):
        """The model's stream of OpenAI objects (a deployment's, watched: ``liveness.WatchedStream``; a ``LocalStream``
        for an in-process model: ``cancel()`` stops either). ``patient``: the request's last candidate, waited for while
        the model has a live replica; otherwise a model that does not take the request in time is given up."""
        callee = self.handles[model]
        if isinstance(callee, OpenAIModel):
            return LocalStream(callee.respond(endpoint, body))
        if (down := self.liveness.unavailable(model)) is not None:
            return Unavailable(down)
        salt = TENANT.get()
        if salt and (model in self.salted or CACHE_SALT in self.caps.get(model, {}).get(endpoint, ())):
            # the key's prefixes cached apart from every other key's; a salt of the client's own divides its key's
            # space further, never reaches another's (nor does a null one)
            own = body.get(CACHE_SALT)
            body = {**body, CACHE_SALT: f"{salt}:{own}" if isinstance(own, str) and own else salt}
        session = SESSION.get()
        handle = callee.options(stream=True, session_id=session) if session else callee.options(stream=True)
        gen = handle.respond.remote(endpoint, body, HEARTBEAT_S)
        reached(model)  # a co-hosted model has it from here on
        return WatchedStream(gen, model, self.liveness, patient)

    async def capabilities(self, models, timeout_s: float = 10.0) -> dict:
        """``{model: {endpoint: [parameters it honours]}}`` for those of ``models`` that answer in time (a
        model not yet up is left out and asked again next time)."""
        async def one(m):
            try:
                callee = self.handles[m]
                asked = callee.capabilities() if isinstance(callee, OpenAIModel) else callee.capabilities.remote()
                caps = await asyncio.wait_for(asked, timeout_s)
                return m, {endpoint: frozenset(names) for endpoint, names in caps.items()}
            except Exception:  # noqa: BLE001 - unknown for now: the plan treats it as capable
                return m, None

        return {m: c for m, c in await asyncio.gather(*(one(m) for m in models)) if c is not None}

    async def refusals(self, models, body: dict, endpoint: str) -> dict:
        """``{model: [parameters of ``body`` it cannot honour]}`` from each model's ``capabilities()``, asked once
        per model, the first time a routed request needs it (a model that does not answer counts as capable)."""
        now = time.monotonic()
        missing = [m for m in models if m not in self.caps and self.caps_retry.get(m, 0) <= now]
        if missing:
            self.caps.update(await self.capabilities(missing, timeout_s=2.0))
            self.caps_retry.update({m: now + self.ASK_AGAIN_S for m in missing if m not in self.caps})
        return {m: refused_parameters(body, self.caps[m][endpoint]) for m in models
                if endpoint in self.caps.get(m, {})}
