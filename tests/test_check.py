"""`proxray check`: every problem of a Serve, job or monitor config at once, before anything starts; the app's builder
refusing the same; and the rehearsal (`--simulate`) of a GPU config."""

import numpy as np
import pytest
import yaml

from conftest import ROOT
from proxray import KNNRouter
from proxray.check import check, detect_kind
from proxray.cli import main

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
POOL = ["meta-llama/Llama-3.2-1B-Instruct", "google/gemma-7b-it"]


def router(path, encoder_id=MINILM, models=POOL):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 384)).astype(np.float32)
    KNNRouter(k=5).fit(X, rng.uniform(size=(40, len(models))), rng.uniform(1e-6, 1e-5, size=(40, len(models))),
                       models=models, encoder_id=encoder_id).save(path)
    return str(path)


def serve_config(tmp_path, args: dict):
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"applications": [{"name": "proxray", "route_prefix": "/",
                                                       "import_path": "proxray.serve.app:build_app", "args": args}]}))
    return path


def test_a_good_serve_config_would_deploy(tmp_path):
    args = {"router": router(tmp_path / "r"), "models": [{"id": m, "engine": "sim"} for m in POOL]}
    report = check(serve_config(tmp_path, args))
    assert report.kind == "serve" and report.ok, report.text()
    assert "ok, it would deploy" in report.text() and "no api_key_file" in report.text()


def test_every_problem_of_a_serve_config_is_named_at_once(tmp_path):
    key = tmp_path / "key"
    key.write_text("k\n")
    key.chmod(0o644)
    args = {"router": router(tmp_path / "r", encoder_id=f"static:{MINILM}"), "api_key_file": str(key),
            "models": [{"id": m, "engine": "sim"} for m in POOL] + [
                {"id": "acme/new-9b", "engine": "sim", "engine_kwargs": {"generic": True}},
                {"id": "v", "engine": "vllm", "source": "./no/such/model",
                 "runtime_env": {"env_vars": {"HF_TOKEN": "hf_secret"}}}]}
    report = check(serve_config(tmp_path, args))
    text = report.text()
    assert not report.ok and len(report.problems) == 5, text
    assert (f"the router was fitted on embeddings of 'static:{MINILM}', the app encodes with '{MINILM}': set "
            "encoder: static") in text
    assert "models ['acme/new-9b', 'v']: the router does not know them" in text
    assert "model 'v': source './no/such/model': no such model folder" in text
    assert "runtime_env.env_vars.HF_TOKEN: a secret in a runtime_env" in text and "hf_secret" not in text
    assert f"api_key_file: {key} has mode 644; a key file must be readable by its owner only (600 or 400)" in text
    # declared new, the unknown model is served by name; the others stay problems
    args["new_models"] = ["acme/new-9b", "v"]
    args["models"] = args["models"][:3]
    args["encoder"] = "static"
    key.chmod(0o600)
    assert check(serve_config(tmp_path, {**args, "new_models": ["acme/new-9b"]})).ok


@pytest.mark.parametrize("mode,ok", [(0o600, True), (0o400, True), (0o440, True), (0o640, False), (0o644, False),
                                     (0o460, False), (0o604, False), (0o660, False), (0o444, False)])
def test_the_key_file_rule_takes_a_kubernetes_secret_and_refuses_a_shared_file(tmp_path, mode, ok):
    """440 is how a Secret is mounted for a pod with fsGroup (root:fsGroup, read-only); a file others can read, or
    that its group can read while its owner can still change it, is refused."""
    from proxray.common.secrets import key_file_problems

    key = tmp_path / "key"
    key.write_text("k\n")
    key.chmod(mode)
    problems = key_file_problems(str(key), "api_key_file")
    assert (problems == []) is ok, problems
    if not ok:
        assert f"has mode {mode:o}; a key file must be readable by its owner only" in problems[0]


def test_the_monitor_application_in_a_serve_config_is_checked_as_its_monitor_config(tmp_path):
    """A Serve config that also deploys the monitor (proxray.monitor.app): the monitor config it names is checked as
    `proxray check` checks a monitor config, its problems named under the application's args."""
    r = router(tmp_path / "r")
    job = {"models": [{"id": m, "engine": "sim", "price": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}}
                      for m in POOL], "grader": {"model": POOL[1]}}
    (tmp_path / "monitor.yaml").write_text(yaml.safe_dump({"router": r, "table": "embedded", "state_dir":
                                                           str(tmp_path / "state"), "job": job}))
    raw = {"applications": [
        {"name": "proxray", "route_prefix": "/", "import_path": "proxray.serve.app:build_app",
         "args": {"router": r, "models": [{"id": m, "engine": "sim"} for m in POOL], "monitor": "proxray-monitor"}},
        {"name": "proxray-monitor", "route_prefix": None, "import_path": "proxray.monitor.app:build_app",
         "args": {"config": str(tmp_path / "monitor.yaml")}}]}
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(raw))
    assert check(tmp_path / "serve.yaml").ok, check(tmp_path / "serve.yaml").text()
    (tmp_path / "monitor.yaml").write_text(yaml.safe_dump({"router": r, "table": "embedded", "state_dir":
                                                           str(tmp_path / "state"), "job": {**job, "grader": None}}))
    raw["applications"][1]["args"]["typo"] = 1
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(raw))
    text = check(tmp_path / "serve.yaml").text()
    assert "applications.1.args.typo: Extra inputs are not permitted" in text
    del raw["applications"][1]["args"]["typo"]
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(raw))
    text = check(tmp_path / "serve.yaml").text()
    assert f"applications.1.args.config ({tmp_path / 'monitor.yaml'}): job: Value error, grader: required" in text, text
    raw["applications"][1]["args"]["config"] = str(tmp_path / "none.yaml")
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(raw))
    assert f"applications.1.args.config: cannot read the monitor config {tmp_path / 'none.yaml'}" in \
        check(tmp_path / "serve.yaml").text()


def test_the_app_refuses_what_check_names_before_any_replica(tmp_path):
    from proxray.serve.app import build_app

    key = tmp_path / "key"
    key.write_text("k\n")
    key.chmod(0o644)
    args = {"router": router(tmp_path / "r"), "encoder": "static", "api_key_file": str(key),
            "models": [{"id": m, "engine": "sim"} for m in POOL]}
    with pytest.raises(ValueError) as e:  # the builder runs check's checks: every problem at once, before binding
        build_app(args)
    assert "fitted on embeddings of 'sentence-transformers/all-MiniLM-L6-v2', the app encodes with 'static:" in str(e.value)
    assert f"api_key_file: {key} has mode 644" in str(e.value)
    checked = [p.removeprefix("applications.0.args.") for p in check(serve_config(tmp_path, args)).problems]
    assert checked == [line.strip() for line in str(e.value).splitlines()[1:]]  # the same problems, in one place


def test_the_kind_is_read_from_the_keys(tmp_path):
    assert [detect_kind(d) for d in ({"applications": []}, {"query_sets": [], "models": []},
                                     {"state_dir": "s", "job": {}})] == ["serve", "job", "monitor"]
    (tmp_path / "x.yaml").write_text("models: []\n")
    report = check(tmp_path / "x.yaml")
    assert not report.ok and "not a Serve config (applications:), an evaluation job config (query_sets:)" in \
        report.problems[0]
    assert main(["check", "--config", str(tmp_path / "x.yaml")]) == 2


def test_every_shipped_job_config_passes_as_its_guide_runs_it(tmp_path, monkeypatch, capsys):
    """The CPU configs after make-tiny-model (as their comments say), the GPU configs on this machine: schema, prices,
    engine arguments against the installed vLLM, query sets."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "jobs").symlink_to(ROOT / "jobs")
    for seed in (0, 1):
        assert main(["make-tiny-model", "--out", f"out/tiny-llama-{'ab'[seed]}", "--seed", str(seed)]) == 0
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # Hub ids are checked against the cache, never fetched
    configs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "jobs" / "configs").glob("*.yaml")
                     if p.name != "mixed_cpu.yaml")  # its external server runs in test_vllm_endpoint, which checks it
    assert main(["check", "--config", *configs]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert out.count("ok, it would deploy") == len(configs) == 6


def test_a_fresh_clone_is_told_to_build_the_tiny_models_first(tmp_path, monkeypatch, capsys):
    """`proxray check --config jobs/configs/cpu_tiny.yaml` before `proxray make-tiny-model`: not "it would deploy" on
    a folder read as a Hub id, but a non-zero exit naming each missing folder and the command that builds it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "jobs").symlink_to(ROOT / "jobs")
    assert main(["check", "--config", "jobs/configs/cpu_tiny.yaml"]) == 2
    out = capsys.readouterr().out
    for name in ("tiny-llama-a", "tiny-llama-b"):
        assert f"source './out/{name}': no such model folder" in out
        assert f"proxray make-tiny-model --out ./out/{name}" in out


def test_a_job_config_names_every_problem(tmp_path):
    bad = {"query_sets": [{"path": str(tmp_path / "missing.jsonl")}],
           "models": [{"id": "a", "engine": "sim", "price": {"input_per_mtok": 1, "output_per_mtok": 1}},
                      {"id": "b", "engine": "vllm", "accelerator_type": "H1OO",
                       "price": {"input_per_mtok": 1, "output_per_mtok": 1}}]}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(bad))
    report = check(tmp_path / "job.yaml")
    assert report.kind == "job" and len(report.problems) >= 3, report.text()
    text = report.text()
    assert "model 'a': engine sim knows only the simulated pool's 14 models" in text
    assert "model 'b': accelerator_type 'H1OO' is not one of Ray's accelerator types" in text
    assert "missing.jsonl' does not exist" in text


def test_a_gpu_job_config_rehearses_on_the_simulated_engine():
    from proxray.evaljob import load_config
    from proxray.evaljob.config import rehearsal, sampled

    real = load_config(ROOT / "jobs" / "configs" / "paper_pool_h100.yaml")
    sim = sampled(rehearsal(real), 4)
    assert [m.id for m in sim.models] == [m.id for m in real.models] and {m.engine for m in sim.models} == {"sim"}
    assert [m.price for m in sim.models] == [m.price for m in real.models]
    assert {m.accelerator_type for m in sim.models} == {"H100"}
    assert sum(m.replica_gpus() for m in real.models) == sum(m.num_gpus for m in sim.models) == 15.5
    assert all(qs.synthetic.tasks == [qs.name] and qs.n == 4 for qs in sim.query_sets)
    unknown = next(m for m in sim.models if m.id == "microsoft/Phi-3-mini-4k-instruct")  # not in the simulated world
    assert unknown.engine_kwargs == {"generic": True}
    from proxray.pool.engines import make_engine

    engine = make_engine(unknown)
    out = engine.generate([{"query_id": "q", "task": "svamp", "prompt": "How many apples does Ava have now?",
                            "answer": "3", "answer_type": "number"}])
    assert out[0]["output_tokens"] > 0
    with pytest.raises(ValueError, match="not in the synthetic pool"):
        make_engine(unknown.model_copy(update={"engine_kwargs": {}}))


def test_the_serve_and_monitor_configs_name_the_monitor_and_the_bucket():
    for name in ("paper_pool_h100", "paper_pool_a100"):
        args = yaml.safe_load((ROOT / "serve_configs" / f"{name}.yaml").read_text())["applications"][0]["args"]
        assert "encoder" not in args  # the default, as the guide fits it
        assert args["router"] == "s3://my-proxray-bucket/proxray/routers/paper_pool"
        assert args["monitor"] == "proxray-monitor" and args["router_max_replicas_per_node"] == 1
        assert args["api_key_file"] == "~/.proxray/api_key"
    mon = yaml.safe_load((ROOT / "monitor_configs" / "paper_pool_h100.yaml").read_text())
    job = yaml.safe_load((ROOT / "jobs" / "configs" / "paper_pool_h100.yaml").read_text())
    assert mon["name"] == "proxray-monitor" and mon["job"]["models"] == job["models"]
    assert mon["router"] == args["router"] and mon["state_dir"].startswith("s3://my-proxray-bucket/")


@pytest.mark.slow
def test_the_cpu_demo_configs_pass_with_the_router_the_readme_fits(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--router", "knn", "--k", "50", "--out", "out/demo/router", "--models",
                 "meta-llama/Llama-3.2-1B-Instruct,google/gemma-7b-it,microsoft/Phi-3-small-8k-instruct,"
                 "meta-llama/Llama-3.3-70B-Instruct"]) == 0
    capsys.readouterr()
    assert main(["check", "--config", str(ROOT / "serve_configs" / "cpu_demo.yaml"),
                 str(ROOT / "monitor_configs" / "cpu_demo.yaml")]) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.count("ok, it would deploy") == 2


def test_a_cluster_config_without_gcs_fault_tolerance_is_a_warning(tmp_path, capsys, monkeypatch):
    """``proxray check cluster.yaml``: the shipped launcher config deploys, with a warning saying what a head loss costs
    while the ~/.proxray/env it copies to the nodes names no external Redis; once it does — or a head command sets
    RAY_REDIS_ADDRESS itself — the check says where GCS fault tolerance comes from instead."""
    import yaml

    from proxray.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))  # the local ~/.proxray that file_mounts copies
    assert main(["check", "--config", str(ROOT / "cluster.yaml")]) == 0
    out = capsys.readouterr().out
    assert "cluster: ok, it would deploy" in out and "warning: no GCS fault tolerance" in out
    assert "head loss takes the whole cluster" in out
    (tmp_path / ".proxray").mkdir()
    (tmp_path / ".proxray" / "env").write_text("FRONTIER_API_KEY=x\nRAY_REDIS_ADDRESS=\n")  # empty: still none
    assert main(["check", "--config", str(ROOT / "cluster.yaml")]) == 0
    assert "warning: no GCS fault tolerance" in capsys.readouterr().out
    (tmp_path / ".proxray" / "env").write_text("export RAY_REDIS_ADDRESS=rediss://cache.internal:6379\n")
    assert main(["check", "--config", str(ROOT / "cluster.yaml")]) == 0
    out = capsys.readouterr().out
    assert "warning" not in out and "GCS fault tolerance: an external Redis (RAY_REDIS_ADDRESS in ~/.proxray/env)" in out
    (tmp_path / ".proxray" / "env").unlink()
    raw = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    raw["head_start_ray_commands"] = [c.replace("RAY_AUTH_MODE=token ray start",
                                                "RAY_REDIS_ADDRESS=redis.internal:6379 RAY_AUTH_MODE=token ray start")
                                      for c in raw["head_start_ray_commands"]]
    (tmp_path / "ft.yaml").write_text(yaml.safe_dump(raw))
    assert main(["check", "--config", str(tmp_path / "ft.yaml")]) == 0
    assert "GCS fault tolerance: an external Redis (the head's start commands)" in capsys.readouterr().out
    # a flag Ray 2.60's ray start does not take is a problem, and no fault tolerance: no RAY_REDIS_ADDRESS anywhere
    raw["head_start_ray_commands"] = [c.replace("RAY_REDIS_ADDRESS=redis.internal:6379 RAY_AUTH_MODE=token ray start",
                                                "RAY_AUTH_MODE=token ray start --redis-address=redis.internal:6379")
                                      for c in raw["head_start_ray_commands"]]
    (tmp_path / "flag.yaml").write_text(yaml.safe_dump(raw))
    assert main(["check", "--config", str(tmp_path / "flag.yaml")]) != 0
    out = capsys.readouterr().out
    assert "head_start_ray_commands: ray start has no option --redis-address" in out, out
    assert "warning: no GCS fault tolerance" in out
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**raw, "head_node_type": "nope"}))
    assert main(["check", "--config", str(tmp_path / "bad.yaml")]) != 0  # a problem: it would not deploy
    assert "head_node_type: 'nope'" in capsys.readouterr().out


def test_serve_simulate_writes_its_rehearsal_to_a_temp_folder_that_goes_when_it_ends(tmp_path, monkeypatch):
    """``proxray serve --simulate``: the rehearsed config lives in a temp folder of its own while ``serve run`` runs it,
    removed when the run ends, and when ``proxray check`` stops it before anything starts."""
    import tempfile

    import proxray.cli.serving as serving

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    seen = []

    def supervised(cmd, env):
        seen.append(yaml.safe_load(open(cmd[-1]))["applications"][0]["args"]["simulate"])
        return 0

    monkeypatch.setattr(serving, "run_supervised", supervised)
    args = {"router": router(tmp_path / "router"), "models": [{"id": m, "engine": "vllm"} for m in POOL]}
    with pytest.raises(SystemExit) as done:
        main(["serve", "--config", str(serve_config(tmp_path, args)), "--simulate"])
    assert done.value.code == 0 and seen == [True] and list(temp.iterdir()) == []
    args["models"].append({"id": "acme/new-model-9b", "engine": "vllm"})  # one the router does not know
    with pytest.raises(SystemExit) as done:
        main(["serve", "--config", str(serve_config(tmp_path, args)), "--simulate"])
    assert done.value.code == 2 and list(temp.iterdir()) == []
