"""The evaluation job on a multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head
and two worker nodes carrying ``accelerator_type:V100`` with one GPU and ``accelerator_type:H100`` with two):
every model of the pool runs at once, each on the nodes its config asks for. Marked slow (three raylets)."""

import pytest

from proxray.evaljob.job import ConfigError, JobConfig, run_job

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
        run_job(config([{**slow_sim(SIM[0], "A100"), "id": "x"}]), tmp_path / "out")
    assert not (tmp_path / "out").exists()
