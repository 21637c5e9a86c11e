"""The KubeRay manifests (deploy/kuberay/) against the ray.io/v1 schema (tests/data/kuberay: generated from KubeRay
v1.5.1's RayJob and RayService CRD files, Kubernetes 1.33's pod templates, closed), and what they must hold for the app to start: Secrets the
image's user reads and `proxray check` accepts, the Hugging Face token beside a writable cache, GPU tolerations,
the fit after the evaluation, the monitor's application naming a config the image holds."""
import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[1]
KUBERAY = ROOT / "deploy" / "kuberay"
SCHEMA = json.loads((ROOT / "tests" / "data" / "kuberay" / "ray.io_v1.schema.json").read_text())


def problems(doc: dict) -> list:
    schema = {**SCHEMA, "$ref": f"#/$defs/ray.io.v1.{doc.get('kind')}"}
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in Draft202012Validator(schema).iter_errors(doc)]


def manifest(name: str) -> dict:
    return yaml.safe_load((KUBERAY / name).read_text())


def templates(doc: dict) -> list:
    spec = doc["spec"].get("rayClusterSpec") or doc["spec"]["rayClusterConfig"]
    return [("head", spec["headGroupSpec"]["template"]["spec"])] + [
        (g["groupName"], g["template"]["spec"]) for g in spec.get("workerGroupSpecs", [])]


@pytest.mark.parametrize("name", ["rayjob.yaml", "rayservice.yaml"])
def test_every_manifest_validates_against_the_kuberay_schema(name):
    assert problems(manifest(name)) == []


def test_the_schema_refuses_what_the_operator_would():
    doc = manifest("rayservice.yaml")
    bad = copy.deepcopy(doc)
    bad["spec"]["rayClusterConfig"]["workerGroupSpec"] = bad["spec"]["rayClusterConfig"].pop("workerGroupSpecs")
    bad["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    bad["spec"]["rayClusterConfig"]["authOptions"] = {"mode": "tokens"}
    found = problems(bad)
    assert any("workerGroupSpec" in p and "not allowed" in p for p in found), found
    assert any("volumeMount" in p and "not allowed" in p for p in found), found
    assert any("authOptions.mode" in p for p in found), found
    job = manifest("rayjob.yaml")
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "2"
    assert any("replicas" in p for p in problems(job))


def kuberay_ray_resources(group: dict) -> dict:
    """The --resources KubeRay v1.5.1 gives `ray start` for a group (common/pod.go: updateRayStartParamsResources,
    then getResourcesMap's parse, which trims quotes and reads JSON): a ValueError where the operator logs a failure."""
    params = dict(group.get("rayStartParams") or {})
    if group.get("resources"):
        params["resources"] = "'" + json.dumps({k: float(v) for k, v in group["resources"].items()}) + "'"
    return json.loads(params.get("resources", "{}").strip("'\"` "))


@pytest.mark.parametrize("name", ["rayjob.yaml", "rayservice.yaml"])
def test_each_group_gives_ray_the_resources_its_models_ask_for_as_kuberay_reads_them(name):
    spec = manifest(name)["spec"]
    spec = spec.get("rayClusterSpec") or spec["rayClusterConfig"]
    got = {g["groupName"]: kuberay_ray_resources(g) for g in spec["workerGroupSpecs"]}
    want = {"h100": {"accelerator_type:H100": 8.0}} | ({"ingress": {"proxray_ingress": 1.0}} if "rayservice" in name else {})
    assert got == want
    # the JSON-in-a-string form the manifests had: KubeRay cannot parse it, and the node would have no H100s
    with pytest.raises(ValueError):
        kuberay_ray_resources({"rayStartParams": {"resources": '"{\\"accelerator_type:H100\\": 8}"'}})
    bad = copy.deepcopy(manifest(name))
    (bad["spec"].get("rayClusterSpec") or bad["spec"]["rayClusterConfig"])["workerGroupSpecs"][0]["resources"] = {"x": 8}
    assert any("resources" in p for p in problems(bad))  # a quantity is a string in the CRD


@pytest.mark.parametrize("name", ["rayjob.yaml", "rayservice.yaml"])
def test_pods_read_their_secrets_and_keep_the_token_out_of_the_cache(name):
    from proxray.common.secrets import key_file_mode_ok

    for group, pod in templates(manifest(name)):
        assert pod["securityContext"]["fsGroup"] == 100, group  # the image's user: ray, group users (100)
        assert pod["serviceAccountName"] == "proxray"
        volumes = {v["name"]: v for v in pod["volumes"]}
        for v in volumes.values():
            if "secret" in v:
                assert key_file_mode_ok(v["secret"]["defaultMode"]), (group, oct(v["secret"]["defaultMode"]))
        (container,) = pod["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert all(m.get("readOnly") for m in container["volumeMounts"] if "secret" in volumes[m["name"]])
        assert env["HF_TOKEN_PATH"] == mounts["hf-token"] + "/token"
        assert not env["HF_HOME"].startswith(mounts["hf-token"]) and not mounts["hf-token"].startswith(env["HF_HOME"])
        if "nvidia.com/gpu" in container["resources"]["limits"]:
            # weights on the shared claim (deploy/kuberay/weights.yaml), not in the container's writable layer
            assert env["HF_HOME"] == mounts["weights"] and not any(m.get("readOnly") for m in container["volumeMounts"]
                                                                   if m["name"] == "weights")
            assert volumes["weights"]["persistentVolumeClaim"]["claimName"] == \
                manifest("weights.yaml")["metadata"]["name"]
        else:  # the head and the ingress run no model: they start whether or not the claim is bound yet
            assert "weights" not in volumes and "weights" not in mounts, group
        # hosted-API keys (api_key_env) from a Secret into every pod's environment
        assert container["envFrom"] == [{"secretRef": {"name": "proxray-env", "optional": True}}]
        assert mounts["api-key"] + "/api_key" == "/home/ray/.proxray/api_key"  # api_key_file: ~/.proxray/api_key
        assert container["image"] == "REGISTRY/proxray:gpu"
        if "nvidia.com/gpu" in container["resources"]["limits"]:
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_the_job_evaluates_then_fits_the_router_the_service_serves():
    job = manifest("rayjob.yaml")
    words = job["spec"]["entrypoint"].split()
    assert words[:2] == ["python", "jobs/evaluate_and_fit.py"] and (ROOT / words[1]).is_file()
    assert not set(words) & {"&&", "||", ";", "|"}  # KubeRay pastes the entrypoint into a shell: one command
    args = dict(zip(words[2::2], words[3::2]))
    assert (ROOT / args["--config"]).is_file()
    serve = yaml.safe_load(manifest("rayservice.yaml")["spec"]["serveConfigV2"])
    assert args["--router-out"] == serve["applications"][0]["args"]["router"]
    monitor = yaml.safe_load((ROOT / "monitor_configs" / "paper_pool_h100.yaml").read_text())
    assert monitor["table"] == args["--out"] + "/routing_table.parquet" and monitor["router"] == args["--router-out"]


def test_the_service_embeds_the_shipped_serve_config_and_the_monitor_the_image_holds():
    svc = manifest("rayservice.yaml")
    shipped = (ROOT / "serve_configs" / "paper_pool_h100.yaml").read_text()
    embedded = svc["spec"]["serveConfigV2"]
    assert embedded.startswith(shipped)  # word for word, then the monitor's application
    apps = yaml.safe_load(embedded)["applications"]
    assert apps[0] == yaml.safe_load(shipped)["applications"][0] and len(apps) == 2
    mon = apps[1]
    assert mon["import_path"] == "proxray.monitor.app:build_app" and mon["route_prefix"] is None
    workdir = re.search(r"^WORKDIR (\S+)$", (ROOT / "deploy" / "Dockerfile").read_text(), re.M).group(1)
    path = mon["args"]["config"]
    assert path.startswith(workdir + "/") and (ROOT / path[len(workdir) + 1:]).is_file()
    from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(yaml.safe_load(embedded))


def test_the_image_build_leaves_the_local_environment_out():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "out", ".git"} <= set(ignored)
    docker = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "docker build -f deploy/Dockerfile -t $REGISTRY/proxray:gpu ." in docker
    assert "docker push $REGISTRY/proxray:gpu" in docker and "bash install.sh gpu" in docker


def test_the_weights_claim_is_shared_and_holds_the_pool():
    claim = manifest("weights.yaml")
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Ti"  # the H100 pool's weights, ~370 GB, twice over


def core_problems(doc: dict) -> list:
    name = {"StorageClass": "io.k8s.api.storage.v1.StorageClass",
            "PersistentVolumeClaim": "io.k8s.api.core.v1.PersistentVolumeClaim",
            "Deployment": "io.k8s.api.apps.v1.Deployment", "Service": "io.k8s.api.core.v1.Service"}[doc["kind"]]
    schema = {**SCHEMA, "$ref": f"#/$defs/{name}"}
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in Draft202012Validator(schema).iter_errors(doc)]


def test_the_weights_claim_has_the_storage_class_it_names():
    """weights.yaml's claim binds only where its storage class exists: the shipped one (EFS CSI, an access point owned
    by the image's user) passes Kubernetes 1.33's strict StorageClass schema, as the claim passes the claim's."""
    claim, sc = manifest("weights.yaml"), manifest("storageclass.yaml")
    assert core_problems(claim) == [] and core_problems(sc) == []
    assert claim["spec"]["storageClassName"] == sc["metadata"]["name"]
    assert sc["provisioner"] == "efs.csi.aws.com" and sc["parameters"]["provisioningMode"] == "efs-ap"
    assert (sc["parameters"]["uid"], sc["parameters"]["gid"]) == ("1000", "100")  # ray, users: as fsGroup above
    bad = copy.deepcopy(sc)
    bad["parameter"] = bad.pop("parameters")
    assert any("parameter" in p for p in core_problems(bad))
    guide = (ROOT / "docs" / "guides" / "deploy-on-a-cluster.md").read_text()
    for step in ("aws efs create-file-system", "--throughput-mode elastic", "aws efs create-mount-target",
                 "--port 2049", "AmazonEFSCSIDriverPolicy", "--addon-name aws-efs-csi-driver",
                 "kubectl apply -f deploy/kuberay/storageclass.yaml -f deploy/kuberay/weights.yaml"):
        assert step in guide, step


@pytest.mark.parametrize("name", ["rayjob.yaml", "rayservice.yaml"])
def test_the_head_and_the_ingress_are_placed_on_the_cpu_node_group(name):
    guide = (ROOT / "docs" / "guides" / "deploy-on-a-cluster.md").read_text()
    for group, pod in templates(manifest(name)):
        (container,) = pod["containers"]
        if "nvidia.com/gpu" in container["resources"]["limits"]:
            assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}, group
        else:
            assert pod["nodeSelector"] == {"proxray.io/pool": "cpu"}, group
    groups = {g["labels"]["proxray.io/pool"]: g for g in yaml.safe_load(
        (KUBERAY / "eksctl-nodegroups.yaml").read_text())["managedNodeGroups"]}
    assert set(groups) == {"cpu", "h100"}  # the node groups the guide creates carry the label the pods select
    assert "eksctl create nodegroup -f deploy/kuberay/eksctl-nodegroups.yaml" in guide


GUIDE = (ROOT / "docs" / "guides" / "deploy-on-a-cluster.md").read_text()
EKS = GUIDE[GUIDE.index("## On Kubernetes (KubeRay)"):]


def test_the_gpu_node_group_takes_the_gpu_pods_and_a_scaler_grows_it_from_zero():
    """eksctl's ClusterConfig (taints and labels are not flags of `eksctl create nodegroup`): the GPU group's nodes
    are the ones the GPU pods select, carry a taint they tolerate, and hold as many GPUs as a pod asks for; it starts
    at 0 and reaches the most GPU pods the manifests ask for, grown by the Cluster Autoscaler the guide installs on the
    CPU group, whose role may do it."""
    config = yaml.safe_load((KUBERAY / "eksctl-nodegroups.yaml").read_text())
    assert config["apiVersion"] == "eksctl.io/v1alpha5" and config["kind"] == "ClusterConfig"
    cpu, gpu = config["managedNodeGroups"]
    most = 0
    for name in ("rayjob.yaml", "rayservice.yaml"):
        spec = manifest(name)["spec"]
        spec = spec.get("rayClusterSpec") or spec["rayClusterConfig"]
        for group in spec["workerGroupSpecs"]:
            pod = group["template"]["spec"]
            limits = pod["containers"][0]["resources"]["limits"]
            if "nvidia.com/gpu" not in limits:
                continue
            assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": gpu["instanceType"]}
            for taint in gpu["taints"]:
                assert any(t["key"] == taint["key"] and t["effect"] == taint["effect"] and t["operator"] == "Exists"
                           for t in pod["tolerations"]), taint
            assert gpu["tags"]["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == limits["nvidia.com/gpu"]
            most = max(most, group["maxReplicas"])
    assert gpu["minSize"] == 0 and gpu["maxSize"] == most == 4 and gpu["propagateASGTags"] is True
    assert cpu["iam"]["withAddonPolicies"]["autoScaler"] is True and cpu["minSize"] == cpu["maxSize"] == 3
    assert min(cpu["volumeSize"], gpu["volumeSize"]) >= 200  # the image on every node
    assert "helm install cluster-autoscaler autoscaler/cluster-autoscaler" in EKS and \
        "autoDiscovery.clusterName=$CLUSTER" in EKS and "nodeSelector.proxray\\.io/pool=cpu" in EKS
    for flag in ("--node-taints", "--node-labels", "--node-volume-size"):  # not eksctl's flags, or not needed
        assert flag not in EKS, flag


def test_the_eks_steps_create_each_resource_after_what_it_needs():
    """The file system is available before its mount targets; the OIDC provider before the role assumed through it;
    account ids from the caller's identity, never an example's; Redis and its Secret before the RayService."""
    def at(step):
        assert step in EKS, step
        return EKS.index(step)

    assert at("aws efs create-file-system") < at("LifeCycleState' --output text)\" = available") \
        < at("aws efs create-mount-target")
    assert at("eksctl utils associate-iam-oidc-provider") < at("eksctl create iamserviceaccount")
    assert at("aws sts get-caller-identity") < at("arn:aws:iam::$ACCOUNT:role/proxray-efs-csi")
    assert "123456789012" not in EKS
    assert at("kubectl create secret generic proxray-gcs-redis") < at("kubectl apply -f deploy/kuberay/redis.yaml") \
        < at("kubectl apply -f deploy/kuberay/rayservice.yaml")


def test_the_services_redis_is_made_in_the_cluster_and_only_its_head_reads_it():
    docs = list(yaml.safe_load_all((KUBERAY / "redis.yaml").read_text()))
    assert [problems for problems in map(core_problems, docs) if problems] == []
    service, deployment = docs
    ft = manifest("rayservice.yaml")["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    host, port = ft["redisAddress"].split(":")
    assert host == service["metadata"]["name"] and int(port) == service["spec"]["ports"][0]["port"]
    pod = deployment["spec"]["template"]["spec"]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert pod["nodeSelector"] == {"proxray.io/pool": "cpu"}
    (redis,) = pod["containers"]
    (env,) = redis["env"]
    assert env["valueFrom"]["secretKeyRef"] == ft["redisPassword"]["valueFrom"]["secretKeyRef"]
    assert "$(REDIS_PASSWORD)" not in " ".join(redis["command"])  # Kubernetes would put it on the command line
    assert "kubectl create secret generic proxray-gcs-redis --from-literal=password=" in EKS
    # the pods' proxray-env leaves out the launcher's RAY_ lines (a Redis the pods cannot reach)
    assert "--from-env-file=<(grep -v -E '^(export )?RAY_' $HOME/.proxray/env" in EKS
    assert "RAY_REDIS" not in (KUBERAY / "rayjob.yaml").read_text() + (KUBERAY / "rayservice.yaml").read_text()


def test_an_edit_of_the_cluster_does_not_start_a_second_one():
    svc = manifest("rayservice.yaml")
    assert svc["spec"]["upgradeStrategy"] == {"type": "None"}
    bad = copy.deepcopy(svc)
    bad["spec"]["upgradeStrategy"] = {"type": "Nope"}
    assert any("upgradeStrategy.type" in p for p in problems(bad))


def test_the_job_has_headroom_for_a_lost_node():
    (h100,) = manifest("rayjob.yaml")["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert h100["maxReplicas"] > h100["replicas"] == 2
