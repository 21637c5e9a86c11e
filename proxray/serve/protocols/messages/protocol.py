"""The Messages protocol's row: ``POST /v1/messages`` and its ``POST /v1/messages/count_tokens``, errors in
Anthropic's shape, Anthropic's event stream."""
from __future__ import annotations

from dataclasses import replace

from fastapi import Request

from proxray.serve.errors import RequestError
from proxray.serve.protocols.base import Protocol, Route
from proxray.serve.protocols.messages.schemas import CountTokensRequest, MessagesRequest, anthropic_shape
from proxray.serve.protocols.messages.turn import AnthropicEvents, MessagesTurn, begin, count_tokens, has_content
from proxray.serve.request.http import error_response


def count_route(gateway):
    """``POST /v1/messages/count_tokens``: the tokens of a Messages request for the model it would reach — the routed
    model for ``model: "proxray"`` (or an alias that routes), planned as the request itself would be, or the named
    one. A model whose endpoint serves Messages counts them itself (sent without an output limit: the endpoint's rate
    limiter books its prompt alone); for every other the count is an estimate from the request as that model reads it,
    marked ``proxray.estimated``. A count costs no budget; it counts toward the key's request rate."""
    async def count(request: Request):
        try:
            key, req, rp = await gateway.open(request, CountTokensRequest)
            await gateway.gate.admit(key, 0.0, None, budget=False)  # a count costs no budget but counts toward the rate
            turn = MessagesTurn(req, gateway.context(MESSAGES, key, request.headers))
            rp = replace(rp, conversation=rp.conversation or turn.session, explain=False)
            plan = await gateway.plan(req, rp, turn, {}, turn.text(gateway.args.routing_text), key, again=True)
            return await count_tokens(turn.client, plan.candidates[0], turn.body)
        except RequestError as e:
            return error_response(e, anthropic_shape)

    return count


MESSAGES = Protocol("messages", "/v1/messages", MessagesRequest, begin, "/messages", AnthropicEvents, has_content,
                    error=anthropic_shape,
                    routes=(Route("POST", "/v1/messages/count_tokens", count_route,
                                  "the input tokens of a Messages request at the model it would reach (an estimate, "
                                  "marked `proxray.estimated`, unless that model's endpoint counts them); costs no "
                                  "budget, counts toward the key's rate", CountTokensRequest),),
                    summary="Anthropic's Messages API (what Claude Code and the anthropic SDK send), routed on its "
                            "system prompt and last user turn; errors and streams in Anthropic's shapes",
                    mirrors="https://docs.anthropic.com/en/api/messages")
