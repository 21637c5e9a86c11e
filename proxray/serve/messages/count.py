"""``POST /v1/messages/count_tokens``: the tokens of a Messages request for the model it would reach — the routed
model for ``model: "proxray"`` (or an alias that routes), planned as the request itself would be, or the named one.
A model whose endpoint serves Messages counts them itself; for every other the count is an estimate from the request
as that model reads it (``MessagesModels.count_tokens``), marked ``proxray.estimated``. A count costs no budget."""
from __future__ import annotations

from dataclasses import replace

from fastapi import Request

from proxray.serve.request.errors import RequestError


class TokenCounter:
    """The route, composed from the ingress's parts: its key gate, request parsing, alias and plan."""

    def __init__(self, ingress):
        self.ingress = ingress

    async def count(self, request: Request):
        from proxray.serve.messages.schemas import CountTokensRequest
        from proxray.serve.messages.turn import MessagesTurn
        from proxray.serve.request.http import error_response, parse_request
        from proxray.serve.request.policy import request_policy
        from proxray.serve.request.schemas import resolve_alias

        ing = self.ingress
        try:
            key = ing.gate.identify(request)
            req = await parse_request(request, CountTokensRequest, ing.args.max_body_bytes)
            req.model, alias = resolve_alias(req.model, ing.args.model_aliases)
            rp = request_policy(req.proxray, key, request.headers, alias)
            ing.gate.check_policy(key, req.model, rp)
            turn = MessagesTurn(req, ing.client, ing.native["messages"], request.headers)
            rp = replace(rp, conversation=rp.conversation or turn.session, explain=False)
            plan = await ing._plan(req, rp, turn, {}, turn.text(ing.args.routing_text), key, again=True)
            return await turn.client.count_tokens(plan.candidates[0], turn.body)
        except RequestError as e:
            return error_response(e, "anthropic")
