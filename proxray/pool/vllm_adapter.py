"""vLLM through Ray's own libraries: ``ray.data.llm`` processors in the evaluation job, the engine arguments and
placement ``ray.serve.llm`` takes when served. Ray and vLLM are imported only where a processor is built."""
from __future__ import annotations

from proxray.pool.spec import Sampling

# Every difference between a GPU and a CPU build of the same model lives in its config (engine_kwargs such
# as dtype / enforce_eager, placement_group_config bundles, accelerator_type, runtime_env such as
# VLLM_CPU_KVCACHE_SPACE), never in a code branch here.

def vllm_engine_kwargs(spec) -> dict:
    """Engine kwargs for vLLM: tensor parallel size from ``num_gpus`` when it is more than one, then the
    config's own kwargs, which win."""
    base = {}
    if (spec.num_gpus or 0) > 1:
        base["tensor_parallel_size"] = int(spec.num_gpus)
    return {**base, **spec.engine_kwargs}


def vllm_placement(spec) -> dict:
    """Where a vLLM engine runs, from the spec (job or app): its ``placement_group_config`` bundles and
    ``runtime_env``, for ``vLLMEngineProcessorConfig`` and ``LLMConfig`` alike (both take these names)."""
    extra = {"placement_group_config": spec.placement_group_config} if spec.placement_group_config else {}
    if spec.runtime_env:
        extra["runtime_env"] = spec.runtime_env
    return extra


def vllm_config(spec, source: str | None = None):
    """The ``ray.data.llm.vLLMEngineProcessorConfig`` of a job model spec: exactly ``replicas`` engines
    (a fixed pool: ``concurrency=(n, n)``; an int would be an autoscaling pool 1..n) on the resources its
    ``placement_group_config`` names (CPU bundles on a CPU cluster; without it the stage asks for a GPU)
    or ``num_gpus`` GPUs on ``accelerator_type`` nodes. A row the engine fails on lands in
    ``__inference_error__`` instead of failing the job."""
    from ray.data.llm import vLLMEngineProcessorConfig

    extra = vllm_placement(spec)
    # the processor's CPU stages (chat template, tokenize, detokenize) each take num_cpus per actor;
    # Ray's default of a whole CPU each starves a small CPU cluster before the engine even starts
    cpu_stage = {"num_cpus": spec.cpus(1.0)}
    extra.update(chat_template_stage=cpu_stage, tokenize_stage=cpu_stage, detokenize_stage=cpu_stage)
    # engine stats off in batch jobs (Ray 2.60, ray-project/ray#61656): a batch whose every row failed has a
    # null ``metrics`` column that cannot be joined with a successful batch's struct
    engine_kwargs = {"disable_log_stats": True, **vllm_engine_kwargs(spec)}
    return vLLMEngineProcessorConfig(
        model_source=source or spec.source or spec.id, engine_kwargs=engine_kwargs,
        concurrency=(spec.replicas, spec.replicas), batch_size=spec.batch_size,
        accelerator_type=spec.accelerator_type, should_continue_on_error=True, log_engine_metrics=False, **extra)


OUTPUT_COLUMNS = ("model", "query_id", "response", "input_tokens", "output_tokens", "error")


def vllm_output_row(row: dict) -> dict:
    """One job output row (``OUTPUT_COLUMNS``) from any row ``ray.data.llm`` yields: a successful row
    (``generated_text``, vLLM's own token counts), a failed one (with ``should_continue_on_error`` it skips
    ``postprocess`` and arrives as the raw row with ``__inference_error__`` set and none of the standard
    columns), or a row already in this shape. Idempotent, so it serves as postprocess and after it.
    The pool model's id travels as ``pool_model`` (a ``model`` column means a LoRA adapter to ray.data.llm).
    ``error`` is "" for a successful row (a string column in every block)."""

    def absent(v):  # None, or the NaN a missing value becomes in a pandas block
        return v is None or (isinstance(v, float) and v != v)

    err = row.get("__inference_error__")
    err = "" if absent(err) else str(err)
    if not err and "response" in row and "generated_text" not in row:
        return {k: row.get(k) for k in OUTPUT_COLUMNS} | {"error": str(row.get("error") or "")}
    if err:
        return {"model": row.get("pool_model"), "query_id": row["query_id"], "response": "", "input_tokens": 0,
                "output_tokens": 0, "error": err}

    def count(v):
        return 0 if absent(v) else int(v)

    return {"model": row.get("pool_model"), "query_id": row["query_id"], "response": row.get("generated_text") or "",
            "input_tokens": count(row.get("num_input_tokens")),
            "output_tokens": count(row.get("num_generated_tokens")), "error": ""}


def vllm_rows(sampling: Sampling):
    """(preprocess, postprocess) row functions between query rows and ``ray.data.llm`` rows."""
    params = {"temperature": sampling.temperature, "max_tokens": sampling.max_tokens, "seed": sampling.seed}

    def preprocess(row):
        return {**row, "messages": [{"role": "user", "content": row["prompt"]}], "sampling_params": params}

    return preprocess, vllm_output_row


def vllm_processor(spec, sampling: Sampling, source: str | None = None):
    """A ``ray.data.llm`` processor running ``spec`` on vLLM. Apply it, then map ``vllm_output_row``
    (failed rows bypass ``postprocess``)."""
    from ray.data.llm import build_processor

    preprocess, postprocess = vllm_rows(sampling)
    light = {"num_cpus": spec.cpus(1.0)}  # the row maps are light; Ray's default (1 CPU a task) starves small clusters
    return build_processor(vllm_config(spec, source), preprocess=preprocess, postprocess=postprocess,
                           preprocess_map_kwargs=light, postprocess_map_kwargs=light)
