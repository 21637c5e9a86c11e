"""What travels between the gateway's rooms beside a body: the paths of the internal request (the forms every
co-hosted engine answers: OpenAI chat completions and completions), and the headers a protocol asks the relay to send
an endpoint that serves it itself (``UpstreamHeaders``), and the fields a body names its output limit in
(``LIMIT_FIELDS``)."""
from __future__ import annotations

CHAT_PATH = "/chat/completions"  # the internal request: the chat form every model takes
COMPLETIONS_PATH = "/completions"
LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")  # a body's output limit, in any protocol


class UpstreamHeaders(dict):
    """Headers a protocol's turn asks the relay to send with a request (``proxray.serve.deployments.endpoint_server``),
    carried in the body under ``FIELD``, and the header that also carries the endpoint's key (``key_header``). Only an
    object of this class is honoured there, which no client's JSON can be: a client's own ``FIELD`` is dropped."""

    FIELD = "__proxray_upstream__"

    def __init__(self, headers: dict, key_header: str | None = None):
        super().__init__(headers)
        self.key_header = key_header

