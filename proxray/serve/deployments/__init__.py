"""The model deployments behind the router: CPU engines in a replica (``models``), vLLM through ray.serve.llm
(``vllm_server``), endpoints the app does not host, relayed (``endpoint_server``), and the one callee interface the
ingress calls them through (``client``)."""
