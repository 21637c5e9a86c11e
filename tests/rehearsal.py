"""The cluster guide (docs/guides/deploy-on-a-cluster.md) in its local form, on the shipped GPU configs as they are:
cluster.yaml's node types under Ray's own autoscaler on this machine (tests/fake_cluster.py: the head with 0 CPUs,
its two cpu_worker nodes, GPU workers launched from zero as the job and the app ask for them), Ray's token auth on, the bucket
`my-proxray-bucket` on moto's S3 API (AWS_ENDPOINT_URL), HEAD = 127.0.0.1, every engine simulated (--simulate):

  proxray check on the H100 job config  ->  the evaluation job through the Jobs API (jobs/build_table.py, --simulate
  --sample 4) to the bucket  ->  the KubeRay RayJob's entrypoint (evaluate, resumed, then fit)  ->  proxray fit
  exactly as the guide says  ->  proxray check passes the shipped H100 and
  A100 Serve configs, the cluster monitor config and the KubeRay manifests' configs, and names an encoder mismatch and
  an unknown model  ->  proxray serve --simulate on the H100 config (its local form: proxies on 127.0.0.1)  ->  routed
  answers through the openai client with the key from ~/.proxray/api_key, replicas placed on H100s  ->  proxray
  monitor start --simulate with the cluster monitor config  ->  drifted traffic  ->  the monitor submits an evaluation.

Run by tests/test_rehearsal.py in a process of its own (its Ray keeps token auth on). Prints one JSON line, last."""
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from journey import ROOT, cli, free_port, step, submit_when_ready, until  # noqa: E402

BUCKET = "s3://my-proxray-bucket/proxray"


def run(args, timeout_s=600, check=True):
    r = subprocess.run([sys.executable, "-m", "proxray", *args], capture_output=True, text=True, timeout=timeout_s,
                       cwd=ROOT)  # the guide's commands run from the repository
    if check and r.returncode:
        raise RuntimeError(f"proxray {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def local_form(path: Path, work: Path, http_port: int) -> Path:
    """A Serve config with HEAD = 127.0.0.1: its proxies on this machine's loopback, on a free port."""
    import yaml

    raw = yaml.safe_load(path.read_text())
    raw["proxy_location"] = "HeadOnly"
    raw["http_options"] = {**raw.get("http_options", {}), "host": "127.0.0.1", "port": http_port}
    out = work / path.name
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return out


def main() -> None:
    import yaml
    from moto.server import ThreadedMotoServer

    work = Path(tempfile.mkdtemp())
    home = work / "home"  # the user's home: ~/.proxray/api_key as the guide makes it
    (home / ".proxray").mkdir(parents=True)
    key = secrets.token_hex(32)
    old = os.umask(0o077)
    (home / ".proxray" / "api_key").write_text(key + "\n")
    os.umask(old)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                       "AWS_ENDPOINT_URL": f"http://{host}:{port}", "HOME": str(home),
                       "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)})
    os.environ.pop("HF_HUB_OFFLINE", None)  # nothing is downloaded: every engine is simulated, the Hub never asked
    import boto3

    boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1").create_bucket(
        Bucket="my-proxray-bucket")

    from fake_cluster import ClusterYamlAutoscaler

    dash, http_port = free_port(), free_port()
    cluster = ClusterYamlAutoscaler(work, free_port(), dash)  # cluster.yaml's node types, Ray's own autoscaler
    step("ray start: the head of cluster.yaml, its autoscaler on the fake multi-node provider")
    cluster.start({**os.environ, "PROXRAY_CACHE": str(work / "cache")})
    os.environ["RAY_ADDRESS"] = cluster.address
    dashboard = f"http://127.0.0.1:{dash}"
    seen = {}
    serving = None
    import ray

    try:
        ray.init(address=cluster.address, log_to_driver=False)
        until("cluster.yaml's min_workers", lambda: cluster.workers().get("cpu_worker") == 2, 120)
        seen["workers_at_start"] = cluster.workers()  # only min_workers: no GPU node before a job asks for one
        # 5. check the job config against the cluster, then 6. evaluate the pool through the Jobs API
        step("check and submit the H100 evaluation job")
        out = run(["check", "--config", "jobs/configs/paper_pool_h100.yaml", "--simulate",
                   "--address", cluster.address]).stdout
        seen["job_check"] = out.splitlines()[0]
        from ray.job_submission import JobSubmissionClient

        jobs = JobSubmissionClient(dashboard)
        sid = submit_when_ready(jobs, entrypoint=f"{sys.executable} jobs/build_table.py --config "
                                "jobs/configs/paper_pool_h100.yaml"
                                f" --simulate --sample 4 --out {BUCKET}/tables/paper_pool",
                                submission_id="tables-1", runtime_env={"working_dir": str(ROOT),
                                                                      "excludes": [".venv", "out", ".git"]})
        status = until("the evaluation job", lambda: (s := jobs.get_job_status(sid)).is_terminal() and s, 400)
        assert str(status) == "SUCCEEDED", jobs.get_job_logs(sid)[-4000:]
        seen["job"] = str(status)
        seen["workers_for_the_job"] = cluster.workers()  # launched from zero by the job's accelerator_type

        # Kubernetes: the RayJob's entrypoint as KubeRay submits it (the evaluation resumes from the table above, then
        # the router is fitted on it)
        step("the RayJob's entrypoint: evaluate, then fit")
        rayjob = yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayjob.yaml").read_text())["spec"]["entrypoint"]
        assert rayjob.startswith("python ")
        sid = jobs.submit_job(entrypoint=f"{sys.executable} {rayjob[len('python '):]} --simulate --sample 4",
                              submission_id="rayjob-1", runtime_env={"working_dir": str(ROOT),
                                                                    "excludes": [".venv", "out", ".git"]})
        status = until("the RayJob's entrypoint", lambda: (s := jobs.get_job_status(sid)).is_terminal() and s, 400)
        assert str(status) == "SUCCEEDED", jobs.get_job_logs(sid)[-4000:]
        from proxray.routing.artifact import read_manifest

        seen["rayjob_router"] = read_manifest(f"{BUCKET}/routers/paper_pool").models

        # 7. fit exactly as the guide says
        step("fit the router")
        cli("fit", "--router", "km", "--table", f"{BUCKET}/tables/paper_pool/routing_table.parquet",
            "--out", f"{BUCKET}/routers/paper_pool")

        # 8. the shipped Serve configs pass; a mismatch and an unknown model are named before any deploy
        step("proxray check on the shipped configs")
        configs = ["serve_configs/paper_pool_h100.yaml", "serve_configs/paper_pool_a100.yaml",
                   "monitor_configs/paper_pool_h100.yaml", "monitor_configs/paper_pool_a100.yaml"]
        r = run(["check", "--config", *configs], check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        seen["checked"] = [line.split(": ")[0] for line in r.stdout.splitlines() if "ok, it would deploy" in line]
        manifest = yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayservice.yaml").read_text())
        # the image holds the repository at /home/ray/proxray (the Dockerfile's WORKDIR): here, the repository
        (work / "rayservice-serve.yaml").write_text(manifest["spec"]["serveConfigV2"].replace(
            "/home/ray/proxray/", f"{ROOT}/"))
        job_manifest = yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayjob.yaml").read_text())
        job_config = job_manifest["spec"]["entrypoint"].split("--config ")[1].split()[0]
        r = run(["check", "--config", str(work / "rayservice-serve.yaml"), job_config], check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "applications.1.args.config" not in r.stdout  # the monitor's application: checked, nothing to say
        seen["kuberay_checked"] = True
        bad = yaml.safe_load((ROOT / "serve_configs" / "paper_pool_h100.yaml").read_text())
        bad["applications"][0]["args"]["encoder"] = "static"
        bad["applications"][0]["args"]["models"].append({"id": "acme/new-model-9b", "engine": "vllm"})
        (work / "bad.yaml").write_text(yaml.safe_dump(bad))
        r = run(["check", "--config", str(work / "bad.yaml")], check=False)
        seen["mismatch_named"] = (r.returncode == 2 and "fitted on embeddings of 'sentence-transformers/all-MiniLM-L6-v2'"
                                  in r.stdout and "the app encodes with 'static:" in r.stdout
                                  and "['acme/new-model-9b']: the router does not know them" in r.stdout)

        # 9. serve the H100 config as a rehearsal, its proxies on 127.0.0.1
        step("proxray serve --simulate")
        served = local_form(ROOT / "serve_configs" / "paper_pool_h100.yaml", work, http_port)
        log = open(work / "serve.log", "w")
        serving = subprocess.Popen([sys.executable, "-m", "proxray", "serve", "--config", str(served), "--simulate"],
                                   stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        import openai

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1",
                               api_key=(home / ".proxray" / "api_key").read_text().strip(), max_retries=0, timeout=30)

        def answer():
            if serving.poll() is not None:
                raise RuntimeError("proxray serve exited:\n" + (work / "serve.log").read_text()[-4000:])
            try:
                return client.chat.completions.create(
                    model="proxray", messages=[{"role": "user", "content": "What is 17 times 23?"}])
            except (openai.APIConnectionError, openai.APIStatusError):
                return None

        first = until("a routed answer", answer, 420, every_s=3)
        seen["routed_model"] = first.model
        seen["router_path"] = first.model_extra["proxray"]["router_path"]
        try:
            openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="wrong", max_retries=0).models.list()
            seen["wrong_key"] = "accepted"
        except openai.AuthenticationError:
            seen["wrong_key"] = 401
        from ray.util.state import list_actors

        replicas = [a for a in list_actors(filters=[("state", "=", "ALIVE")], limit=10000)
                    if a.class_name.startswith("ServeReplica:proxray:")]
        seen["replicas"] = len(replicas)
        ingress_nodes = {a.node_id for a in replicas if a.class_name.endswith(":RouterIngress")}
        seen["ingress_on"] = sorted(cluster.workers_of(ingress_nodes))
        seen["workers_for_the_app"] = cluster.workers()
        used = ray.cluster_resources().get("GPU", 0) - ray.available_resources().get("GPU", 0)
        seen["gpus_in_use"] = round(used, 1)

        # 10. the monitor with the cluster monitor config, as a rehearsal; drifted traffic; it submits
        step("proxray monitor start --simulate")
        run(["monitor", "start", "--config", "monitor_configs/paper_pool_h100.yaml", "--simulate",
             "--address", cluster.address, "--timeout", "300"])
        langs = ["Python", "Rust", "Go", "TypeScript", "Haskell", "Kotlin"]
        asks = ["parses an ISO-8601 timestamp", "merges two sorted linked lists", "computes a CRC32 checksum",
                "rate-limits calls with a token bucket", "serialises a binary tree to JSON",
                "finds the longest palindromic substring", "retries an HTTP request with exponential backoff",
                "validates an IBAN", "streams a CSV file into batches", "detects a cycle in a directed graph"]
        drifted = [f"Write a {lang} function that {ask}, with unit tests and a docstring."  # a task the pool never saw
                   for lang in langs for ask in asks]
        for text in drifted:
            client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": text}])

        def submitted():
            out = run(["monitor", "status", "--address", cluster.address]).stdout
            try:
                st = json.loads(out)
            except ValueError:
                raise RuntimeError(f"proxray monitor status printed more than its JSON:\n{out[-4000:]}") from None
            seen["monitor_drifted"], seen["monitor_blocked"] = st["drifted"], st["blocked"]
            return [j for j in st["jobs"] if j["kind"] == "drift" and j.get("id")] or None

        got = until("the monitor's evaluation", submitted, 240, every_s=5)
        seen["monitor_submitted"] = got[0]["id"]
        seen["submitted_status"] = got[0]["status"]
        seen["jobs_api"] = [j.submission_id for j in jobs.list_jobs() if j.submission_id == got[0]["id"]]
        run(["monitor", "stop", "--address", cluster.address], check=False)
    except Exception:
        print(json.dumps(seen), file=sys.stderr)
        raise
    finally:
        if serving is not None and serving.poll() is None:
            os.killpg(serving.pid, signal.SIGTERM)
            try:
                serving.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(serving.pid, signal.SIGKILL)
        try:
            ray.shutdown()
        finally:
            cluster.stop()
            moto.stop()
            shutil.rmtree(work, ignore_errors=True)  # the nodes' caches and the configs written (~88 MB a run)
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
