"""The pool of models: the engines that answer queries (simulated, transformers, vLLM) behind one interface."""
