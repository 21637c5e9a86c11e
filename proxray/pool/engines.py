"""The one registry of in-process engines (``CPU_ENGINES``) and ``make_engine(spec)``, which builds one from a
pool-model spec. Every engine answers through the one interface, ``proxray.pool.engine.Engine``:

* ``sim`` (``proxray.pool.simulated.SimEngine``): a simulated model of the synthetic world, for demos and load
  tests;
* ``transformers`` (``proxray.pool.transformers_engine.TransformersEngine``): real generation with Hugging Face
  ``transformers`` on a CPU;
* ``openai`` (``proxray.pool.openai_engine.OpenAIEngine``): the client of an OpenAI-compatible endpoint proxray does
  not host, with its rate limit, retries and key;
* ``vllm`` is not built here: it runs through Ray's own ``ray.data.llm`` in the job and ``ray.serve.llm`` when
  served (``proxray.pool.vllm_adapter``), imported only there.
"""
from __future__ import annotations

from proxray.pool.engine import Engine
from proxray.pool.simulated import SimEngine
from proxray.pool.transformers_engine import TransformersEngine

CPU_ENGINES: dict[str, type[Engine]] = {"sim": SimEngine, "transformers": TransformersEngine}


def unknown_kwargs(name: str, cls, kwargs: dict) -> list:
    """A problem naming every key of ``kwargs`` that ``cls``'s constructor does not take (with the closest name)."""
    import difflib
    import inspect

    params = list(inspect.signature(cls.__init__).parameters)[2:]  # past self and the model / source
    unknown = sorted(set(kwargs) - set(params))
    if not unknown:
        return []
    hints = "".join(f"; did you mean {h[0]!r} for {k!r}?" for k in unknown
                    if (h := difflib.get_close_matches(k, params, n=1)))
    return [f"model {name!r}: engine_kwargs {unknown} are not arguments of the {cls.__name__} "
            f"(allowed: {', '.join(params)}){hints}"]


def make_engine(spec, limiter=None) -> Engine:
    """The in-process engine for a model spec (``proxray.pool.spec.PoolModel``): a CPU engine, or the client of an
    OpenAI-compatible endpoint (``limiter``: the job's ``RateLimiter`` actor for it); vLLM is not built here."""
    if spec.engine in CPU_ENGINES:
        return CPU_ENGINES[spec.engine](spec.source or spec.id, **spec.engine_kwargs)
    if spec.engine == "openai":
        from proxray.pool.openai_engine import OpenAIEngine

        return OpenAIEngine(spec, limiter)
    raise ValueError(f"engine {spec.engine!r} has no in-process engine (vllm runs through ray.data.llm)")
