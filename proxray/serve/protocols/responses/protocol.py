"""The Responses protocol's row: ``POST /v1/responses``, the Responses event stream, and the stored-response routes
(``stored``)."""
from __future__ import annotations

from proxray.serve.protocols.base import Protocol, Route
from proxray.serve.protocols.chat import openai_params
from proxray.serve.protocols.responses.schemas import ResponsesRequest
from proxray.serve.protocols.responses.stored import StoredResponses
from proxray.serve.protocols.responses.turn import NamedEvents, begin, has_content


def _stored(route: str):
    return lambda gateway: getattr(StoredResponses(gateway.store, gateway.gate, gateway.metrics, gateway.cache),
                                   route)


RESPONSES = Protocol("responses", "/v1/responses", ResponsesRequest, begin, "/responses", NamedEvents, has_content,
                     honoured=openai_params("openai.types.responses.response_create_params"),
                     routes=(Route("GET", "/v1/responses/{response_id}", _stored("get"),
                                   "a stored response (one of the caller's key), as it was answered"),
                             Route("DELETE", "/v1/responses/{response_id}", _stored("remove"),
                                   "deletes a stored response: `{\"id\", \"object\": \"response\", "
                                   "\"deleted\": true}`"),
                             Route("GET", "/v1/responses/{response_id}/input_items", _stored("items"),
                                   "the input items of a stored response, as a list (`limit`, `order`, `after`)")),
                     summary="OpenAI's Responses API: stored responses, `previous_response_id` continues one (its "
                             "conversation keeps its model), `instructions`, function tools; streams named events",
                     mirrors="https://platform.openai.com/docs/api-reference/responses/create")
