"""The Responses protocol's row: ``POST /v1/responses``, the Responses event stream, and the stored-response routes
(``stored``)."""
from __future__ import annotations

from proxray.serve.protocols.base import Protocol, Route
from proxray.serve.protocols.chat import openai_params
from proxray.serve.protocols.responses.schemas import ResponsesRequest
from proxray.serve.protocols.responses.stored import StoredResponses
from proxray.serve.protocols.responses.turn import NamedEvents, begin, has_content


def _stored(route: str):
    return lambda ingress: getattr(StoredResponses(ingress.store, ingress.gate, ingress.metrics), route)


RESPONSES = Protocol("responses", "/v1/responses", ResponsesRequest, begin, "/responses", NamedEvents, has_content,
                     honoured=openai_params("openai.types.responses.response_create_params"),
                     routes=(Route("GET", "/v1/responses/{response_id}", _stored("get")),
                             Route("DELETE", "/v1/responses/{response_id}", _stored("remove")),
                             Route("GET", "/v1/responses/{response_id}/input_items", _stored("items"))))
