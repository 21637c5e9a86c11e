import numpy as np
import pytest

from proxray.devtools import build_tiny_model

from proxray.pool.simulated import SimEngine

from proxray.pool.spec import PoolModel, Sampling

from proxray.pool.transformers_engine import TransformersEngine

from proxray.pool.vllm_adapter import vllm_config, vllm_rows
from proxray.data.synthetic import generate_queries
from proxray.pool.simulated import SimulatedPool


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


def test_transformers_engine_really_generates(tiny_model):
    eng = TransformersEngine(tiny_model, batch_size=4)
    rows = generate_queries(1).to_dict("records")[:6]
    out = eng.generate(rows, Sampling(max_tokens=8))
    assert len(out) == 6
    for r, o in zip(rows, out):
        text = eng._text(r["prompt"])
        assert o["input_tokens"] == len(eng.tokenizer(text, add_special_tokens=False)["input_ids"])
        assert 1 <= o["output_tokens"] <= 8 and isinstance(o["response"], str)
    again = eng.generate(rows, Sampling(max_tokens=8))
    assert [o["response"] for o in out] == [o["response"] for o in again]  # greedy is deterministic
    # batching must not change answers (left padding done right)
    single = TransformersEngine(tiny_model, batch_size=1).generate(rows[:2], Sampling(max_tokens=8))
    assert [o["response"] for o in single] == [o["response"] for o in out[:2]]


def test_sim_engine_follows_the_simulated_skill():
    q = generate_queries(150, tasks=["gsm8k", "sciq"])
    rows = q.to_dict("records")
    from proxray.evaljob.grading import grade

    for model in ("deepseek-ai/deepseek-math-7b-instruct", "google/gemma-2b-it"):
        eng = SimEngine(model)
        out = eng.generate(rows)
        correct = np.array([grade(o["response"], r["answer"], r["answer_type"]) for o, r in zip(out, rows)])
        p = SimulatedPool(models=[model]).p_correct(q)[:, 0]
        assert abs(correct.mean() - p.mean()) < 0.06
        assert out == SimEngine(model).generate(rows)  # deterministic: retries give the same answers
    with pytest.raises(ValueError, match="not in the synthetic pool"):
        SimEngine("gpt-17")


def test_vllm_path_config_and_rows():
    spec = PoolModel(id="meta-llama/Llama-3.3-70B-Instruct", engine="vllm",
                     price={"input_per_mtok": 0.15, "output_per_mtok": 0.3}, accelerator_type="H100", num_gpus=4, replicas=2, batch_size=32,
                     engine_kwargs={"max_model_len": 4096})
    cfg = vllm_config(spec)
    assert cfg.model_source == spec.id and cfg.batch_size == 32
    assert cfg.concurrency == (2, 2)  # exactly `replicas` engines: an int would be an autoscaling pool 1..n
    assert cfg.accelerator_type == "H100" and cfg.should_continue_on_error and cfg.placement_group_config is None
    assert cfg.engine_kwargs["tensor_parallel_size"] == 4 and cfg.engine_kwargs["max_model_len"] == 4096
    assert cfg.engine_kwargs["disable_log_stats"] is True and cfg.log_engine_metrics is False  # ray#61656
    cpu = PoolModel(id="t", source="/m", engine="vllm", price={"input_per_mtok": 0, "output_per_mtok": 0}, num_gpus=0,
                    num_cpus=0.1,
                    placement_group_config={"bundles": [{"CPU": 1}]}, runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1"}})
    cfg = vllm_config(cpu, source="/abs/m")
    b = cfg.placement_group_config["bundles"]
    assert cfg.model_source == "/abs/m" and len(b) == 1 and b[0]["CPU"] == 1 and not b[0].get("GPU")
    assert "tensor_parallel_size" not in cfg.engine_kwargs and cfg.runtime_env["env_vars"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert cfg.chat_template_stage["num_cpus"] == 0.1  # the CPU stages must not take a whole core each
    pre, post = vllm_rows(Sampling(temperature=0.0, max_tokens=7, seed=1))
    row = pre({"query_id": "q1", "prompt": "2+2?", "answer": "4", "pool_model": "m/a"})
    assert "model" not in row  # a ``model`` column would name a LoRA adapter to ray.data.llm
    assert row["messages"] == [{"role": "user", "content": "2+2?"}] and row["sampling_params"]["max_tokens"] == 7
    ok = post({**row, "generated_text": "4", "num_input_tokens": 5, "num_generated_tokens": 1})
    assert ok == {"model": "m/a", "query_id": "q1", "response": "4", "input_tokens": 5, "output_tokens": 1, "error": ""}
    assert post(ok) == ok  # idempotent: also mapped after the processor
    # a failed row skips postprocess and arrives raw, without the standard columns (NaN counts, no text)
    bad = post({**row, "__inference_error__": "VLLMValidationError: too long", "num_input_tokens": float("nan")})
    assert bad == {"model": "m/a", "query_id": "q1", "response": "", "input_tokens": 0, "output_tokens": 0,
                   "error": "VLLMValidationError: too long"}
    assert post({**row, "generated_text": None, "num_input_tokens": None, "__inference_error__": ""})["error"] == ""


def test_live_prompts_are_recognised_and_a_sim_judge_reads_the_verdict():
    from proxray.data.synthetic import recognize_task

    for seed in (0, 3):
        q = generate_queries(40, seed=seed)
        assert [recognize_task(p) for p in q.prompt] == list(q.task)
    assert recognize_task("What is the capital of France?") is None
    q = generate_queries(60, seed=1)
    gsm, sciq = q[q.task == "gsm8k"], q[q.task == "sciq"]
    eng = SimEngine("deepseek-ai/deepseek-math-7b-instruct")
    live = lambda df: [{"query_id": f"k{i}", "task": "live", "prompt": p} for i, p in enumerate(df.prompt)]  # noqa: E731
    right = {t: np.mean([", simulated, correct]" in o["response"] for o in eng.generate(live(df))])
             for t, df in (("gsm8k", gsm), ("sciq", sciq))}
    assert abs(right["gsm8k"] - 0.77) < 0.15 and abs(right["sciq"] - 0.68) < 0.15  # Table 2's skill, from the text
    judge = SimEngine("meta-llama/Llama-3.3-70B-Instruct", judge_error=0.1)
    rows = [{"query_id": f"j{i}", "prompt": f"Q?\nAnswer:\n[m, simulated, {'correct' if i % 2 else 'incorrect'}] x\nScore:"}
            for i in range(400)]
    scores = [int(o["response"] == "Score: 1") for o in judge.generate(rows)]
    agree = np.mean([s == i % 2 for i, s in enumerate(scores)])
    assert 0.85 <= agree <= 0.95
