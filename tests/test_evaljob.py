"""The evaluation job end to end on a local Ray: real Ray Data, real engines (tiny transformers
model and the sim engine), real files. Marked slow (Ray start-up), run by CI all the same."""
import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import ROOT
from proxray import KNNRouter, RoutingTable
from proxray.evaljob import ConfigError, JobConfig, graded_parts, load_config, run_job
from proxray.pool.spec import PoolModel

pytestmark = pytest.mark.slow

SIM = ["meta-llama/Llama-3.2-1B-Instruct", "microsoft/Phi-3-small-8k-instruct", "meta-llama/Llama-3.3-70B-Instruct"]


@pytest.fixture(scope="module", autouse=True)
def ray_local(local_ray):
    """Every test of this module runs on one local Ray (conftest's ``local_ray``)."""


def config(models, n_per_task=3, sampling=None, **extra):
    return JobConfig.model_validate({
        "output": "unused", "sampling": sampling or {"max_tokens": 8},
        "query_sets": [{"name": "synthetic", "synthetic": {"n_per_task": n_per_task, "seed": 5}}],
        "models": models, **extra})


def sim(model_id, **kw):
    return {"id": model_id, "engine": "sim", "price": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}, "batch_size": 5, "num_cpus": 0.25, **kw}


def pairs(out):
    rows = graded_parts(out)
    return list(zip(rows["query_id"], rows["model"]))


def test_cpu_job_builds_a_table_routers_fit_on(tmp_path, encoder):
    from proxray.devtools import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny", seed=1)
    cfg = config([{"id": "tiny", "source": tiny, "engine": "transformers", "price": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
                   "batch_size": 8, "num_cpus": 0.5}] + [sim(m) for m in SIM])
    res = run_job(cfg, tmp_path / "out")
    out = tmp_path / "out"
    assert res["complete_queries"] == 30 and res["duplicates"] == 0 and res["open_errors"] == 0
    table = RoutingTable.read(out / "routing_table.parquet")
    assert table.models == sorted(["tiny", *SIM]) and table.n_queries == 30
    df = table.df
    np.testing.assert_allclose(df.cost, (df.input_tokens * 1.0 + df.output_tokens * 2.0) / 1e6 * (df.model == "tiny")
                               + (df.input_tokens * 0.1 + df.output_tokens * 0.2) / 1e6 * (df.model != "tiny"))
    assert (df[df.model == "tiny"].output_tokens <= 8).all()
    # the 70B simulated model is far better than the 1B one, as in the paper's Table 2
    acc = df.groupby("model").correct.mean()
    assert acc[SIM[2]] > acc[SIM[0]]
    assert "| model |" in (out / "summary.md").read_text()
    # the partitioned table is the same table
    assert RoutingTable(graded_parts(out)).n_queries == 30
    acc_m, cost_m = table.matrices()
    r = KNNRouter(k=5).fit(encoder.encode(table.prompts), acc_m, cost_m, models=table.models)
    assert r.route(encoder.encode(table.prompts[:3]), lam=0.0).shape == (3,)


def test_interrupted_job_resumes_without_duplicates(tmp_path):
    cfg = config([sim(m) for m in SIM[:2]], n_per_task=4)
    out = tmp_path / "out"
    first = run_job(cfg, out, max_batches=2)
    done_first = len(pairs(out))
    assert 0 < done_first < 80 and first["complete_queries"] < 40
    second = run_job(cfg, out)
    assert sum(r["todo"] for r in second["runs"]) == 80 - done_first  # only the missing pairs ran
    p = pairs(out)
    assert len(p) == len(set(p)) == 80 and second["complete_queries"] == 40
    third = run_job(cfg, out)
    assert third["runs"] == []  # nothing left to do


def test_engine_failures_go_to_the_errors_file_and_are_retried(tmp_path):
    bad = ["synth5-gsm8k-0", "synth5-medqa-2"]
    out = tmp_path / "out"
    res = run_job(config([sim(SIM[0]), sim(SIM[1], engine_kwargs={"fail_query_ids": bad})]), out)
    assert res["open_errors"] == 2 and res["complete_queries"] == 28
    errors = pd.read_parquet(out / "errors.parquet")
    assert sorted(errors.query_id) == sorted(bad) and errors.error.str.contains("injected failure").all()
    assert not set(bad) & {q for q, m in pairs(out) if m == SIM[1]}  # never graded as wrong
    res = run_job(config([sim(SIM[0]), sim(SIM[1])]), out)
    assert res["open_errors"] == 0 and res["complete_queries"] == 30
    assert [r["todo"] for r in res["runs"]] == [2]
    assert not (out / "errors.parquet").exists()


def test_a_killed_worker_loses_nothing(tmp_path):
    marker = tmp_path / "crashed"
    out = tmp_path / "out"
    res = run_job(config([sim(SIM[0], engine_kwargs={"crash_marker": str(marker), "crash_after_rows": 10})],
                         n_per_task=4), out)
    assert marker.exists()  # the worker process really died mid-job
    p = pairs(out)
    assert len(p) == len(set(p)) == 40 and res["complete_queries"] == 40 and res["duplicates"] == 0


def test_adding_a_model_runs_only_that_model(tmp_path):
    out = tmp_path / "out"
    run_job(config([sim(SIM[0])]), out)
    res = run_job(config([sim(SIM[0]), sim(SIM[2])]), out)
    assert [(r["model"], r["todo"]) for r in res["runs"]] == [(SIM[2], 30)]
    assert RoutingTable.read(out / "routing_table.parquet").models == sorted([SIM[0], SIM[2]])


@pytest.mark.parametrize("patch,message", [
    ({"models": [{"id": "a", "engine": "sim", "price": {"input_per_mtok": -1, "output_per_mtok": 0}}]}, "models.0.price.input_per_mtok"),
    ({"models": [{"id": "a", "engine": "sim"}]}, "the evaluation job prices every answer"),
    ({"models": [{"id": "a", "engine": "tgi", "price": {"input_per_mtok": 1, "output_per_mtok": 0}}]}, "models.0.engine"),
    ({"query_sets": [{"path": "a.jsonl", "hf": "gsm8k"}]}, "exactly one of path, hf, synthetic"),
    ({"models": [{"id": "a", "engine": "sim", "price": {"input_per_mtok": 1, "output_per_mtok": 1}}] * 2}, "repeated: a"),
    ({"sampling": {"max_tokens": 0}}, "sampling.max_tokens"),
    ({"modles": []}, "modles"),
])
def test_config_errors_name_the_field(tmp_path, patch, message):
    raw = {"output": "o", "query_sets": [{"synthetic": {"n_per_task": 1}}],
           "models": [{"id": "a", "engine": "sim", "price": {"input_per_mtok": 1, "output_per_mtok": 1}}], **patch}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(tmp_path / "c.yaml")


def test_shipped_configs_validate():
    for name, n in (("cpu_tiny", 5), ("cpu_vllm", 3), ("paper_pool", 14)):
        cfg = load_config(ROOT / "jobs" / "configs" / f"{name}.yaml")
        assert len(cfg.models) == n
    pool = load_config(ROOT / "jobs" / "configs" / "paper_pool.yaml")
    assert {m.accelerator_type for m in pool.models} == {"A100", "H100"}  # vLLM 0.29 cannot run on V100
    assert "microsoft/Phi-3-small-8k-instruct" not in {m.id for m in pool.models}  # vLLM 0.29 cannot load it
    assert all(m.engine_kwargs["max_model_len"] <= 4096 for m in pool.models)


def test_output_goes_to_s3_and_resumes_from_it(s3, tmp_path, monkeypatch):
    uri, client, _ = s3
    monkeypatch.chdir(tmp_path)  # nothing may land on the driver's local disk
    cfg = config([sim(m) for m in SIM[:2]], n_per_task=4)
    first = run_job(cfg, uri, max_batches=3)
    assert 0 < first["rows"] < 80
    res = run_job(cfg, uri)
    assert sum(r["todo"] for r in res["runs"]) == 80 - first["rows"]  # resumed from what S3 holds
    assert res["complete_queries"] == 40 and res["duplicates"] == 0
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="runs", Prefix="job/")["Contents"]]
    assert {"job/routing_table.parquet", "job/summary.md", "job/summary.csv"} <= set(keys)
    assert sum(k.startswith("job/table/") for k in keys) >= 4 and not [k for k in keys if ".tmp" in k]
    assert list(tmp_path.iterdir()) == []
    import io

    body = client.get_object(Bucket="runs", Key="job/routing_table.parquet")["Body"].read()
    table = RoutingTable(pd.read_parquet(io.BytesIO(body)))
    assert table.n_queries == 40 and table.models == sorted(SIM[:2])
    assert run_job(cfg, uri)["runs"] == []


def test_resume_is_keyed_on_content_not_on_folders(tmp_path):
    out = tmp_path / "out"
    models = [sim(SIM[0]), sim(SIM[1])]
    run_job(config(models), out)
    assert run_job(config(models), out)["runs"] == []  # nothing changed: nothing runs
    # another sampling: every pair runs again; the old rows stay beside the new ones but are not used
    res = run_job(config(models, sampling={"max_tokens": 4}), out)
    assert [(r["model"], r["todo"]) for r in res["runs"]] == [(SIM[0], 30), (SIM[1], 30)]
    assert res["stale_rows"] == 60 and res["rows"] == 60 and res["duplicates"] == 0
    # one model's price changes: only that model runs, and the table carries the new price
    repriced = [sim(SIM[0]), sim(SIM[1], price={"input_per_mtok": 0.1, "output_per_mtok": 2.0})]
    res = run_job(config(repriced, sampling={"max_tokens": 4}), out)
    assert [(r["model"], r["todo"]) for r in res["runs"]] == [(SIM[1], 30)]
    df = RoutingTable.read(out / "routing_table.parquet").df
    rows = df[df.model == SIM[1]]
    np.testing.assert_allclose(rows.cost, (rows.input_tokens * 0.1 + rows.output_tokens * 2.0) / 1e6)
    # a folder name proves nothing: a part moved under another model's folder still counts by its columns
    a, b = (sorted((out / "table").iterdir()))[:2]
    for f in a.iterdir():
        f.rename(b / ("moved-" + f.name))
    assert run_job(config(repriced, sampling={"max_tokens": 4}), out)["runs"] == []


def test_model_ids_whose_plain_slugs_collide_both_run(tmp_path):
    from proxray.common.naming import slug

    ids = ["a:fp16", "a@fp16"]
    assert slug(ids[0]) != slug(ids[1])
    out = tmp_path / "out"
    res = run_job(config([sim(i, source=SIM[0]) for i in ids]), out)
    assert [r["todo"] for r in res["runs"]] == [30, 30] and res["complete_queries"] == 30
    assert RoutingTable.read(out / "routing_table.parquet").models == ids
    assert len({p.name for p in (out / "table").iterdir()}) == 2


def test_every_config_problem_is_reported_before_ray_starts(tmp_path):
    from proxray.evaljob import check_config

    cfg = JobConfig.model_validate({
        "output": str(tmp_path / "o"),
        "query_sets": [{"path": str(tmp_path / "nowhere.jsonl")}],
        "models": [sim(SIM[0], engine_kwargs={"latency": 1}), sim(SIM[1], accelerator_type="H10O"),
                   {"id": "t", "engine": "transformers", "source": str(tmp_path / "no-model"),
                    "price": {"input_per_mtok": 1, "output_per_mtok": 1}}]})
    with pytest.raises(ConfigError) as e:
        check_config(cfg)
    msg = str(e.value)
    assert "engine_kwargs ['latency'] are not arguments of the SimEngine" in msg and "did you mean 'latency_s'" in msg
    assert "accelerator_type 'H10O' is not one of Ray's accelerator types; did you mean 'H100'?" in msg
    assert "query_sets.0.path" in msg and "nowhere.jsonl" in msg and "no-model" in msg
    assert not (tmp_path / "o").exists()


def live_queries(path, n_per_task=2, seed=11):
    """Live traffic: prompts only, no reference answers (what the monitor sends to the job)."""
    from proxray.data.synthetic import generate_queries

    q = generate_queries(n_per_task, seed=seed)
    q[["query_id", "prompt"]].assign(task="live", query_id=lambda d: "live-" + d.query_id).to_json(
        path, orient="records", lines=True)
    return q


def test_judge_grades_queries_without_answers(tmp_path):
    live_queries(tmp_path / "live.jsonl")
    cfg = config([sim(m) for m in SIM], grader={"model": SIM[2]})
    cfg.query_sets.append(cfg.query_sets[0].model_copy(update={"synthetic": None, "path": str(tmp_path / "live.jsonl"),
                                                               "name": "live"}))
    out = tmp_path / "out"
    res = run_job(cfg, out)
    t = RoutingTable.read(out / "routing_table.parquet").df
    live = t["split"] == "live"
    assert live.sum() == 20 * 3 and (~live).sum() == 30 * 3
    assert set(t.loc[live, "grader"]) == {f"judge:{SIM[2]}"} and set(t.loc[~live, "grader"]) == {"reference"}
    assert (t.loc[live, "judge_cost"] > 0).all() and (t.loc[~live, "judge_cost"] == 0).all()
    # the simulated judge reads the simulated verdict, wrong 5 % of the time
    truth = t.loc[live, "response"].str.contains(", simulated, correct]")
    agree = float((t.loc[live, "correct"] == truth.astype(float)).mean())
    assert agree >= 0.85 and res["judge"]["graded"] == 60 and res["judge"]["judge_cost"] == pytest.approx(
        t.loc[live, "judge_cost"].sum())
    # resumable: nothing generated or judged twice
    again = run_job(cfg, out)
    assert [r["todo"] for r in again["runs"]] == [] and again["judge"]["todo"] == 0
    # a new rubric re-judges the stored responses without generating them again
    cfg2 = cfg.model_copy(update={"grader": cfg.grader.model_copy(update={"rubric": "Grade.\n{question}\n---\n{response}\nScore:"})})
    third = run_job(cfg2, out)
    assert [r["todo"] for r in third["runs"]] == [] and third["judge"]["todo"] == 60 and third["complete_queries"] == 50


def test_a_judge_without_a_score_leaves_error_rows(tmp_path):
    from proxray.devtools import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny", seed=0)  # a real (random) causal LM: its replies carry no score
    live_queries(tmp_path / "live.jsonl", n_per_task=1)
    judge = {"id": "tiny-judge", "engine": "transformers", "source": str(tiny), "price": {"input_per_mtok": 0.1, "output_per_mtok": 0.1},
             "batch_size": 5, "num_cpus": 0.5}
    cfg = JobConfig.model_validate({"output": "unused", "sampling": {"max_tokens": 4},
                                    "query_sets": [{"name": "live", "path": str(tmp_path / "live.jsonl")}],
                                    "models": [sim(SIM[0]), judge], "grader": {"model": "tiny-judge", "max_tokens": 4}})
    res = run_job(cfg, tmp_path / "out")
    assert res["judge"]["graded"] + res["judge"]["unparsed"] == 20 and res["open_errors"] >= res["judge"]["unparsed"] > 0
    errors = pd.read_parquet(tmp_path / "out" / "errors.parquet")
    assert errors["error"].str.contains("judge output has no score").any()


@pytest.mark.parametrize("grader,message", [
    ({"model": "nope"}, "grader.model 'nope' is not a model of the pool"),
    ({"model": "a", "rubric": "only {question}"}, r"grader.rubric must contain \{response\}"),
    ({"model": "a", "rubric": "{question} {response} {other}"}, "only {question} and {response}"),
])
def test_grader_config_errors(grader, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message.replace("{question} and {response}", r"\{question\} and \{response\}")):
        JobConfig.model_validate({"query_sets": [{"synthetic": {"n_per_task": 1}}], "grader": grader,
                                  "models": [{"id": "a", "engine": "sim", "price": {"input_per_mtok": 1, "output_per_mtok": 1}}]})


def test_queries_without_answers_need_a_grader(tmp_path):
    live_queries(tmp_path / "live.jsonl", n_per_task=1)
    cfg = JobConfig.model_validate({"query_sets": [{"path": str(tmp_path / "live.jsonl")}], "models": [sim(SIM[0])]})
    with pytest.raises(ConfigError, match="10 of 10 queries have no reference answer: add a grader"):
        run_job(cfg, tmp_path / "out")


def test_earlier_model_spellings_load_with_a_warning_naming_the_new_field():
    """price_in / price_out and gpus_per_replica (job configs before the one pool-model spec) mean price and
    num_gpus; each says what to write instead; giving both spellings is an error."""
    old = {"id": "m", "engine": "vllm", "price_in": 0.15, "price_out": 0.3, "gpus_per_replica": 4}
    with pytest.warns(FutureWarning) as said:
        spec = PoolModel.model_validate(old)
    assert [str(w.message) for w in said] == [
        "model 'm': price_in / price_out are deprecated: write price: {input_per_mtok: ..., output_per_mtok: ...}",
        "model 'm': gpus_per_replica is deprecated: write num_gpus"]
    assert (spec.price.input_per_mtok, spec.price.output_per_mtok, spec.num_gpus, spec.gpus) == (0.15, 0.3, 4, 4)
    assert spec.cost(1000, 500) == pytest.approx((1000 * 0.15 + 500 * 0.3) / 1e6)
    with pytest.raises(ValueError, match="give num_gpus, or the earlier gpus_per_replica, not both"):
        PoolModel.model_validate({"id": "m", "engine": "vllm", "num_gpus": 1, "gpus_per_replica": 2})
