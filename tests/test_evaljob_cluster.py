"""The evaluation job on a multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head
and two worker nodes carrying ``accelerator_type:V100`` with one GPU and ``accelerator_type:H100`` with two):
every model of the pool runs at once, each on the nodes its config asks for. Marked slow (three raylets)."""

import pytest

from proxray.evaljob import ConfigError, JobConfig, run_job

pytestmark = pytest.mark.slow

SIM = ["meta-llama/Llama-3.2-1B-Instruct", "microsoft/Phi-3-small-8k-instruct", "meta-llama/Llama-3.3-70B-Instruct"]


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = {"V100": c.add_node(num_cpus=2, num_gpus=1, resources={"accelerator_type:V100": 1}),
             "H100": c.add_node(num_cpus=2, num_gpus=2, resources={"accelerator_type:H100": 2})}
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield {k: n.node_id for k, n in nodes.items()}
    ray.shutdown()
    c.shutdown()


def config(models, n_per_task=3):
    return JobConfig.model_validate({
        "output": "unused", "sampling": {"max_tokens": 8},
        "query_sets": [{"name": "synthetic", "synthetic": {"n_per_task": n_per_task, "seed": 3}}],
        "models": models})


def slow_sim(model_id, accelerator=None, latency_s=1.0):
    spec = {"id": model_id, "engine": "sim", "price": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}, "batch_size": 5, "num_cpus": 0.25,
            "engine_kwargs": {"latency_s": latency_s}}
    return {**spec, "accelerator_type": accelerator, "num_gpus": 1} if accelerator else spec


def test_models_land_where_their_config_asks_and_run_at_once(cluster, tmp_path):
    """Each model's engines run on the nodes its accelerator_type names, and the three models run at once: every
    model's first batch comes back before any model's last (the job's own record of its batches, not a timing
    ratio; one after another, the second model would start after the first had finished)."""
    models = [slow_sim(SIM[0], "V100"), slow_sim(SIM[1], "H100"), slow_sim(SIM[2], "H100")]
    three = run_job(config(models), tmp_path / "three")
    assert three["complete_queries"] == 30
    nodes = {r["model"]: r["nodes"] for r in three["runs"]}
    assert nodes == {SIM[0]: [cluster["V100"]], SIM[1]: [cluster["H100"]], SIM[2]: [cluster["H100"]]}
    first, last = (max(r["first_batch_s"] for r in three["runs"]), min(r["seconds"] for r in three["runs"]))
    print(f"every first batch by {first:.1f} s, the first model done at {last:.1f} s")
    assert first < last, three["runs"]


def test_an_accelerator_the_cluster_lacks_fails_before_any_work(cluster, tmp_path):
    with pytest.raises(ConfigError, match=r"model 'x': accelerator_type 'A100' is not among the cluster's "
                                          r"\(H100, V100\)"):
        run_job(config([{**slow_sim(SIM[0], "A100"), "id": "x", "source": SIM[0]}]), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_vllm_is_refused_on_v100_nodes_with_the_path_that_works_there(cluster, tmp_path, monkeypatch):
    """vLLM 0.29 has no sm_70 kernels: a vllm model asking for V100 nodes is refused before Ray starts, and one
    asking for no accelerator on a cluster whose GPUs are all V100 is refused once the job sees the cluster; both
    name the transformers path and its config, which passes the same checks."""
    from pathlib import Path

    import proxray.evaljob.preflight as preflight
    from proxray.evaljob.preflight import check_cluster
    from proxray.evaljob import check_config, load_config

    vllm = {"id": "meta-llama/Llama-3.1-8B-Instruct", "engine": "vllm",
            "price": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}, "num_gpus": 1}
    with pytest.raises(ConfigError, match=r"model 'meta-llama/Llama-3.1-8B-Instruct': engine vllm cannot run on V100 "
                                          r"nodes.*no sm_70.*engine: transformers.*jobs/configs/paper_pool_v100.yaml"):
        run_job(config([{**vllm, "accelerator_type": "V100"}]), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(preflight, "cluster_accelerators", lambda: {"V100"})
    with pytest.raises(ConfigError, match=r"engine vllm cannot run on this cluster, whose GPUs are all V100.*paper_pool_v100"):
        check_cluster(config([vllm]).models)
    monkeypatch.setattr(preflight, "cluster_accelerators", lambda: {"V100", "H100"})
    check_cluster(config([vllm]).models)  # an H100 node can take it
    v100 = load_config(Path(__file__).resolve().parents[1] / "jobs" / "configs" / "paper_pool_v100.yaml")
    assert {m.engine for m in v100.models} == {"transformers"} and {m.accelerator_type for m in v100.models} == {"V100"}
    assert all(m.engine_kwargs["dtype"] == "float16" and m.runtime_env for m in v100.models)
    check_config(v100, tmp_path / "v100")  # every model passes the checks a job runs before Ray starts
