"""The request path of the routed endpoint: the HTTP boundary (``http``, ``errors``), the request schemas and app
args (``schemas``), encoding the routing text (``encoding``, ``encoder_service``), the routing policy and the plan
(``policy``, ``plan``, ``budget``), fallback over the plan's candidates (``fallback``) and the stream writer (``sse``)."""
