"""OpenAI's Responses API on the routed endpoint: the request (``schemas``), its translation to and from chat
completions for models that do not serve it (``translate``), the stored responses every ingress replica shares
(``store``) and one request's turn through the gateway (``turn``)."""
