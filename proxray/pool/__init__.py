"""The pool of models: the one pool-model spec and the one sampling spec (``spec``), the engines that answer queries
behind one interface (``engine``; the registry ``engines``: simulated, transformers; vLLM through Ray's own
libraries, ``vllm_adapter``), the simulated pool (``simulated``) and the checks before anything starts
(``preflight``)."""
