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

A request of any protocol crosses the same stages in the same order (``proxray.serve.stages.PATH``, run by
``_handle``): its spans and counters, parse (key, body, alias, the request's policy, the key's 403s), the key's slot,
its hold (the key's rate and budget, a hold of its body as sent: nothing else is done for a request its key may not
send), its protocol's turn (the one internal request every candidate is sent), its conversation, plan (the routing
text embedded, the router's decision), the hold moved to the chosen model's, the candidates in order
(``first_answer``); then the answer or its stream, whose usage every stage's count settles. A failure undoes what the
stages entered took, in reverse order. The client's request goes to the chosen model as sent (only ``model`` is
rewritten) or, to a model whose endpoint does not serve its protocol, translated to chat completions; the answer comes
back in the client's protocol with a ``proxray`` object added (and ``x-proxray-*`` headers). ``args`` follow
``proxray.serve.config.AppArgs``; the replica's parts are its ``Gateway`` (``proxray.serve.gateway``). Handles are
injected through ``.bind()``, so tests compose the same app from small real parts. Each ingress replica builds its
FastAPI app from its own args and the protocol table (``http.gateway_api``, Serve's late-bound
``__serve_build_asgi_app__``, as ray.serve.llm's ``LLMServer`` does), so docs and CORS are per app.
"""

from fastapi import FastAPI, Request
from ray import serve

from proxray.serve.errors import RequestError
from proxray.serve.gateway import Gateway, deployment_name
from proxray.serve.protocols import PROTOCOLS
from proxray.serve.request.http import error_response, gateway_api
from proxray.serve.stages import Flight, path, respond, run

__all__ = ["RouterIngress", "deployment_name"]


@serve.deployment
@serve.ingress()
class RouterIngress:
    """A Serve deployment around one ``Gateway`` (the replica's parts) and the request path's stages over it."""

    def __init__(self, args: dict, handles: dict, protocols: dict | None = None, families: tuple = ()):
        from proxray.routing.registry import register

        for family in families:  # router families beside the shipped ones (``build``'s)
            register(family)
        self.gateway = Gateway(args, handles, PROTOCOLS if protocols is None else protocols)
        self.stages = path(self.gateway)

    def endpoint(self, protocol):
        """The FastAPI endpoint of ``protocol``'s route: the one request path (``_handle``)."""
        async def handle(request: Request):
            return await self._handle(request, protocol)

        handle.__name__ = handle.__qualname__ = protocol.name  # the route's name in /docs
        return handle

    async def _handle(self, request: Request, protocol):
        """One request through the stages (``proxray.serve.stages.PATH``); a refusal in its protocol's error shape."""
        f = Flight(request, protocol, self.gateway.args.timeout_s)
        try:
            counts = await run(self.stages, f)
        except RequestError as e:  # the stages entered undid what they took
            return error_response(e, protocol.error)
        return await respond(f, counts, self.gateway)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return gateway_api(self.gateway, self.endpoint)

    async def __del__(self):
        """Serve's graceful stop, once the replica's requests drained (``Gateway.close``)."""
        await self.gateway.close()

    def counts(self) -> dict:
        """What this replica did for the requests it took (through a Serve handle, for operators' tools and tests;
        never over HTTP): ``Gateway.counts``."""
        return self.gateway.counts()
