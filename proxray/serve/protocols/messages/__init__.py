"""Anthropic's Messages API on the gateway (``POST /v1/messages``, ``/v1/messages/count_tokens``): its request and
error shapes (``schemas``), its translation to and from chat completions for the models that do not serve it
(``translate``), one request through the gateway and the models as it sees them (``turn``)."""
