"""The request path's shape, followed call by call: one ingress replica's ``Gateway`` and stages built in this process
(no Serve: the replica's context given), its models two endpoints on a stand-in hosted API on 127.0.0.1 relayed from
here, and a keyed routed request with a budget — whole, streamed, and one whose first candidate is down — run through
the ingress's own ``_handle`` with every call into proxray's code traced (``sys.setprofile``, coroutine origins for the
tasks a request starts). Nothing on a request's call path calls back into a module below it on that path (a stage's
helper handed to the key gate, a stage's data asked of it): each room is entered from above and left by returning."""
import asyncio
import json
import os
import sys
import types

import pytest

from openai_standin import MODEL, StandIn, key_file
from serve_helpers import fit_router

import proxray

pytestmark = pytest.mark.slow
CHEAP, DEAR = "ext-cheap", "ext-dear"
APP = "request-path"
ROOT = os.path.dirname(proxray.__file__)


@pytest.fixture(scope="module")
def ray_here():
    import ray

    from conftest import _start_local_ray

    started = not ray.is_initialized()
    if started:
        _start_local_ray()
    yield
    for actor in ray.util.list_named_actors(all_namespaces=True):  # the app's shared actors (keys ledger, answers)
        if actor["name"].endswith(APP):
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def replica(tmp_path_factory, encoder, ray_here):
    """(the ingress's ``_handle`` bound to a replica's parts, the chat protocol, a key with a budget)."""
    from ray import serve

    from proxray.serve.builder import app_args
    from proxray.serve.front import free_port
    from proxray.serve.gateway import Gateway
    from proxray.serve.ingress import RouterIngress
    from proxray.serve.protocols import PROTOCOLS
    from proxray.serve.stages import path
    from proxray.serve.tenancy.keys import new_key_entry

    tmp = tmp_path_factory.mktemp("request-path")
    fit_router(tmp / "router", encoder, [CHEAP, DEAR], {CHEAP: (0.5, 1e-6), DEAR: (0.9, 3e-5)})  # DEAR routed first
    key, path_ = key_file(tmp)
    standin = StandIn(key, faults=False)
    down = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: the model asked first fails, the next answers
    token = new_key_entry(tmp / "keys.yaml", "team", budget={"usd": 5.0, "window_s": 3600, "over_budget": "cheapest"})
    ctx = types.SimpleNamespace(app_name=APP, replica_id=types.SimpleNamespace(unique_id="r1"))
    real = serve.get_replica_context
    serve.get_replica_context = lambda: ctx
    try:
        built = {}
        for name, dear_url in (("up", standin.url), ("down", down)):
            models = [{"id": m, "engine": "openai", "source": MODEL, "api_key_file": str(path_), "max_retries": 0,
                       "base_url": dear_url if m == DEAR else standin.url,
                       "price": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}} for m in (CHEAP, DEAR)]
            a = app_args({"router": str(tmp / "router"), "models": models, "encoder_backend": "torch",
                          "keys_file": str(tmp / "keys.yaml")})
            gw = Gateway(a.model_dump(), {m.id: {"relay": m.model_dump()} for m in a.models}, PROTOCOLS)
            built[name] = types.SimpleNamespace(gateway=gw, stages=path(gw))
        chat = next(p for p in PROTOCOLS.values() if p.name == "chat")
        yield RouterIngress.func_or_class._handle, built, chat, token
    finally:
        serve.get_replica_context = real
        standin.stop()


def _request(body: dict, token: str):
    from starlette.requests import Request

    raw = json.dumps(body).encode()
    sent = []

    async def receive():
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.sleep(3600)  # the client stays

    headers = [(b"content-type", b"application/json"), (b"authorization", f"Bearer {token}".encode())]
    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers,
                    "query_string": b"", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "scheme": "http",
                    "root_path": "", "http_version": "1.1"}, receive)


def _module(filename: str) -> str | None:
    if not filename.startswith(ROOT):
        return None
    name = os.path.relpath(filename, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
    return name.removesuffix(".__init__")


class CallPaths:
    """Every call into proxray's code while on: the proxray functions on its call path (its frame's callers, then
    where the coroutine of the task running it was made); ``returns()``: the calls into a module that is on that
    path below the caller's own module (A calls B, B calls back into A)."""

    def __init__(self):
        self.calls = []

    def __call__(self, frame, event, arg):
        if event != "call" or not (callee := _module(frame.f_code.co_filename)):
            return
        path, fr = [], frame.f_back
        while fr is not None:
            if m := _module(fr.f_code.co_filename):
                path.append((m, fr.f_code.co_qualname))
            fr = fr.f_back
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        for filename, _, function in getattr(task.get_coro(), "cr_origin", None) or () if task else ():
            if m := _module(filename):
                path.append((m, function))
        self.calls.append(((callee, f"{frame.f_code.co_qualname}:{frame.f_code.co_firstlineno}"), path))

    def returns(self) -> list:
        out = set()
        for (callee, function), path in self.calls:
            modules = [m for i, (m, _) in enumerate(path) if i == 0 or m != path[i - 1][0]]  # runs of one module
            if modules and callee != modules[0] and callee in modules[1:]:
                out.add(f"{path[0][0]}:{path[0][1]} -> {callee}:{function}")
        return sorted(out)


async def _drain(response):
    if hasattr(response, "body_iterator"):
        response.body = b"".join([c if isinstance(c, bytes) else c.encode() async for c in response.body_iterator])
    return response


@pytest.mark.parametrize("kind", ["whole", "stream", "fallback"])
def test_a_keyed_routed_request_never_calls_back_into_a_module_on_its_path(replica, kind):
    handle, built, chat, token = replica
    me = built["down" if kind == "fallback" else "up"]
    body = {"model": "proxray", "messages": [{"role": "user", "content": "What is 6 times 7?"}], "max_tokens": 8,
            **({"stream": True} if kind == "stream" else {})}

    async def once(trace=None):
        sys.set_coroutine_origin_tracking_depth(64 if trace else 0)
        sys.setprofile(trace)
        try:
            return await _drain(await handle(me, _request(body, token), chat))
        finally:
            sys.setprofile(None)
            sys.set_coroutine_origin_tracking_depth(0)

    asyncio.run(once())  # imports and first calls out of the way
    trace = CallPaths()
    response = asyncio.run(once(trace))
    assert response.status_code == 200, response.body
    text = response.body.decode()
    answered = CHEAP if kind == "fallback" else DEAR
    assert f'"model":"{answered}"' in text.replace(" ", "") and '"key":{"name":"team"' in text.replace(" ", "")
    rooms = {m for (m, _), _ in trace.calls}
    assert {"proxray.serve.stages.hold", "proxray.serve.tenancy.gate", "proxray.serve.request.fallback"} <= rooms
    returns = trace.returns()
    print(json.dumps({"kind": kind, "calls": len(trace.calls), "rooms": len(rooms), "returns": returns}))
    assert returns == [], returns


def test_a_whole_answer_gives_its_relay_slot_back_with_the_answer(replica):
    """A keyed whole answer from an endpoint relayed from the replica: the relay's slot (``max_ongoing_requests``)
    is free once the answer is, not once the garbage collector finds the request (its stages' state holds cycles)."""
    import gc

    handle, built, chat, token = replica
    me = built["up"]
    relay = me.gateway.client.handles[DEAR]
    body = {"model": DEAR, "messages": [{"role": "user", "content": "What is 6 times 7?"}], "max_tokens": 8}

    async def three():  # the slots read before the loop ends (which closes every generator left open)
        answers = [await _drain(await handle(me, _request(body, token), chat)) for _ in range(3)]
        return answers, relay.slots._value

    gc.disable()
    try:
        answers, free = asyncio.run(three())
    finally:
        gc.enable()
    assert [r.status_code for r in answers] == [200] * 3 and free == relay.cap, (free, relay.cap)
