"""The one image every cluster runs (deploy/Dockerfile), and cluster.yaml as Ray's launcher reads it — what can be checked
without building the image (its base is on Docker Hub) or reaching AWS: the base image's Python satisfies
``requires-python``; the lock it installs holds what Ray's AWS node provider imports (the head's autoscaler launches
the workers with it); pip leaves no cache in the layer; the guide's build steps are the Dockerfile's; both clusters
name the same image; cluster.yaml passes Ray's own cluster-config schema (what `ray up` validates against) with its
defaults filled in as `ray up` fills them; an ImageId left as shipped is refused by EC2 before anything starts."""
import ast
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()
GUIDE = (ROOT / "docs" / "guides" / "deploy-on-a-cluster.md").read_text()


def cluster() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def locked(platform: str) -> dict:
    return {line.split("==")[0].lower(): line.split("==")[1] for line in
            (ROOT / "constraints" / f"{platform}.txt").read_text().splitlines() if "==" in line and line[0] != "#"}


def test_the_base_images_python_satisfies_requires_python():
    from packaging.specifiers import SpecifierSet

    base = re.search(r"^FROM (\S+)$", DOCKERFILE, re.M).group(1)
    tag = re.search(r":(\d+\.\d+\.\d+)-py(\d)(\d+)-gpu$", base)
    assert tag, base
    ray_version, python = tag.group(1), f"{tag.group(2)}.{tag.group(3)}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert python in SpecifierSet(project["requires-python"]), (python, project["requires-python"])
    assert locked("gpu")["ray"] == ray_version  # the image's own Ray is the one the lock installs over it


def test_the_gpu_lock_holds_what_rays_aws_provider_imports():
    import ray.autoscaler._private.aws as aws

    stdlib_or_ray = {"ray", "typing", "copy", "logging", "threading", "time", "collections", "functools", "itertools",
                     "json", "os", "sys", "re", "hashlib", "uuid", "random", "string", "dataclasses", "enum",
                     "concurrent", "datetime", "math", "subprocess", "pathlib", "socket", "base64", "textwrap"}
    imported = set()
    for path in Path(aws.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - stdlib_or_ray
    assert {"boto3", "botocore"} <= third_party
    gpu = locked("gpu")
    assert all(name in gpu for name in third_party), sorted(third_party - set(gpu))
    assert gpu["boto3"] == locked("dev")["boto3"]  # the version the suite ran against


def test_the_image_keeps_no_pip_cache_and_installs_the_gpu_lock():
    run = [line for line in DOCKERFILE.splitlines() if line.startswith("RUN ")]
    assert len(run) == 1 and "PIP_NO_CACHE_DIR=1 bash install.sh gpu" in run[0] and "rm -rf /home/ray/.cache/pip" in run[0]
    assert re.search(r"^ENV PATH=/home/ray/proxray/.venv/bin:\$PATH$", DOCKERFILE, re.M)  # `ray start` runs from it


def test_the_guide_builds_and_pushes_the_image_as_the_dockerfile_says():
    steps = ["aws ecr create-repository --repository-name proxray",
             "aws ecr get-login-password --region us-west-2 | docker login --username AWS --password-stdin $REGISTRY",
             "docker build -f deploy/Dockerfile -t $REGISTRY/proxray:gpu . && docker push $REGISTRY/proxray:gpu",
             'sed -i "s|REGISTRY/proxray:gpu|$REGISTRY/proxray:gpu|" cluster.yaml deploy/kuberay/*.yaml']
    for text in (DOCKERFILE, GUIDE[:GUIDE.index("## 2.")], GUIDE[GUIDE.index("## On Kubernetes"):]):
        where = [text.index(s) for s in steps]
        assert where == sorted(where)


def test_every_cluster_runs_the_one_image():
    images = {cluster()["docker"]["image"]}
    for name in ("rayjob.yaml", "rayservice.yaml"):
        images |= set(re.findall(r"image: (\S+)", (ROOT / "deploy" / "kuberay" / name).read_text()))
    assert images == {"REGISTRY/proxray:gpu"}


def test_cluster_yaml_passes_rays_own_schema_as_ray_up_reads_it():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(cluster())  # defaults filled in, the docker section checked, as `ray up` does
    validate_config(config)  # Ray's ray-schema.json, then its own rules
    assert config["docker"]["container_name"] == "proxray"
    types = config["available_node_types"]
    assert types["cpu_worker"]["min_workers"] == 2 and types["cpu_worker"]["resources"] == {"proxray_ingress": 1}
    assert sum(t.get("max_workers", 0) for n, t in types.items() if n != config["head_node_type"]) == \
        config["max_workers"]


def test_an_image_id_left_as_shipped_stops_ray_up_at_once():
    """EC2 refuses an id that is not ami- and 8 or 17 hex digits (InvalidAMIID.Malformed) before it starts anything;
    every node type uses the one value (the &ami anchor), so filling it in once is enough."""
    text = (ROOT / "cluster.yaml").read_text()
    ids = {t["node_config"]["ImageId"] for t in cluster()["available_node_types"].values()}
    assert len(ids) == 1 and text.count("ImageId: &ami ") == 1
    (shipped,) = ids
    assert not re.fullmatch(r"ami-([0-9a-f]{8}|[0-9a-f]{17})", shipped)
    assert "aws ec2 describe-images" in GUIDE and "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)" in GUIDE


def test_the_head_may_launch_the_workers_and_the_workers_reach_the_bucket_only():
    types = cluster()["available_node_types"]
    profiles = {n: t["node_config"]["IamInstanceProfile"]["Arn"].rsplit("/", 1)[1] for n, t in types.items()}
    assert profiles.pop("head") == "proxray-head" and set(profiles.values()) == {"proxray-worker"}
    setup = GUIDE[GUIDE.index("The head's role (`proxray-head`)"):GUIDE.index("## 1.")]
    for action in ("ec2:RunInstances", "ec2:TerminateInstances", "ec2:CreateTags", "ec2:DescribeInstances",
                   "iam:PassRole", "s3:GetObject", "s3:PutObject", "s3:ListBucket"):
        assert action in setup, action
    assert "role/proxray-worker" in setup
