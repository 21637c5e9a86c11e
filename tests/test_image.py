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
             'sed -i "s|REGISTRY/proxray:gpu|$REGISTRY/proxray:gpu|; s|r=REGISTRY;|r=$REGISTRY;|" cluster.yaml deploy/kuberay/*.yaml']
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
    import json

    policies = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", setup, re.S)]
    assert len(policies) == 2  # the head's, the workers'
    for policy in policies:  # both pull the image from ECR (after initialization_commands log the host in)
        actions = {a for s in policy["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
        assert {"ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"} <= actions, actions
        assert {"s3:GetObject", "s3:PutObject", "s3:ListBucket"} <= actions
    assert not any(a.startswith(("ec2:", "iam:")) for s in policies[1]["Statement"]
                   for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]))  # the workers launch nothing


CONDA_BASHRC = """# ~/.bashrc: executed by bash(1) for non-login shells.
case $- in
    *i*) ;;
      *) return;;
esac
# >>> conda initialize >>>
# !! Contents within this block are managed by 'conda init' !!
__conda_setup="$("$HOME/anaconda3/bin/conda" 'shell.bash' 'hook' 2> /dev/null)"
if [ $? -eq 0 ]; then
    eval "$__conda_setup"
else
    if [ -f "$HOME/anaconda3/etc/profile.d/conda.sh" ]; then
        . "$HOME/anaconda3/etc/profile.d/conda.sh"
    else
        export PATH="$HOME/anaconda3/bin:$PATH"
    fi
fi
unset __conda_setup
# <<< conda initialize <<<
export PATH=$HOME/anaconda3/bin:$PATH
"""


def _launcher_shell(tmp_path, with_image_line: bool) -> dict:
    """What `ray`, `python`, `proxray` and `serve` resolve to in the shell Ray 2.60's launcher runs a container command
    in (its own ``_with_interactive`` wrapping), in a home whose ~/.bashrc does what Ray's base image's does (conda's
    block, anaconda first on PATH) — followed by deploy/bashrc as the image appends it, or not."""
    import os
    import stat
    import subprocess

    from ray.autoscaler._private.command_runner import _with_interactive

    home = tmp_path / ("image" if with_image_line else "base")
    conda = home / "anaconda3" / "bin"
    conda.mkdir(parents=True)
    for tool in ("python", "python3", "ray", "serve", "pip"):  # anaconda's: a Python without proxray
        (conda / tool).write_text("#!/bin/sh\necho anaconda\nexit 3\n")
        (conda / tool).chmod(stat.S_IRWXU)
    bashrc = CONDA_BASHRC
    if with_image_line:
        bashrc += (ROOT / "deploy" / "bashrc").read_text().replace("/home/ray/proxray", str(ROOT))
    (home / ".bashrc").write_text(bashrc)
    (home / ".profile").write_text('if [ -n "$BASH_VERSION" ] && [ -f "$HOME/.bashrc" ]; then . "$HOME/.bashrc"; fi\n')
    venv = ROOT / ".venv" / "bin"
    cmd = ("for t in ray python proxray serve; do echo \"$t=$(command -v $t)\"; done; "
           "python -c 'import proxray, sys; print(\"prefix=\" + sys.prefix)'; ray --version")
    env = {"HOME": str(home), "PATH": f"{venv}:{conda}:/usr/bin:/bin",  # the image's ENV PATH, then the base image's
           "TERM": "dumb", "LANG": os.environ.get("LANG", "C.UTF-8")}
    r = subprocess.run(" ".join(_with_interactive(cmd)), shell=True, env=env, capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    found = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    return {"found": found, "out": r.stdout, "rc": r.returncode}


def test_the_launchers_login_shell_runs_the_projects_ray_and_proxray(tmp_path):
    """Ray's launcher wraps every command as ``bash --login -c -i 'source ~/.bashrc; …'``; the base image's conda block
    puts anaconda first, so without deploy/bashrc `ray start` would be anaconda's Ray (and its workers anaconda's Python,
    which has no proxray). With the line the image appends, every tool is the project's environment."""
    import sys

    base = _launcher_shell(tmp_path, with_image_line=False)
    assert base["found"]["ray"].endswith("anaconda3/bin/ray") and base["found"]["python"].endswith("anaconda3/bin/python")
    image = _launcher_shell(tmp_path, with_image_line=True)
    venv = str(ROOT / ".venv" / "bin")
    assert image["rc"] == 0, image["out"]
    assert {t: image["found"][t] for t in ("ray", "python", "proxray", "serve")} == \
        {t: f"{venv}/{t}" for t in ("ray", "python", "proxray", "serve")}
    assert Path(image["found"]["prefix"]).resolve() == Path(sys.prefix).resolve()  # proxray imports there
    assert "2.60.0" in image["out"]  # `ray --version`: the project's Ray


def test_the_image_makes_its_users_cache_folders_and_appends_the_shell_line():
    run = DOCKERFILE[DOCKERFILE.index("\nRUN "):DOCKERFILE.index("\nENV PATH")]
    assert "mkdir -p /home/ray/.cache/huggingface/hub /home/ray/.ray" in run  # as the image's user, ray
    assert "cat deploy/bashrc >> /home/ray/.bashrc" in run
    assert not re.search(r"^USER ", DOCKERFILE, re.M)  # the base image's user (ray) builds them, so owns them
    line = [x for x in (ROOT / "deploy" / "bashrc").read_text().splitlines() if not x.startswith("#")]
    assert line == ["export PATH=/home/ray/proxray/.venv/bin:$PATH"]


def fake_bin(tmp_path, **scripts) -> dict:
    """An environment whose PATH starts with a folder of stand-in commands (name -> bash body), HOME in tmp_path."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "home").mkdir(exist_ok=True)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path / "home")}


def test_every_host_pulls_through_the_ecr_credential_helper(tmp_path):
    """Ray runs a plain `docker pull` on each host (command_runner.py) and never logs in itself — and on `ray up
    --restart-only` it pulls before any command of ours runs, when a 12-hour `docker login` may have expired. So the
    initialization commands (on the host, on every node type) install Amazon's ECR credential helper and name it for
    the registry in docker's config: each pull gets a fresh login from the instance role. Rehearsed here in bash:
    the helper installed where it is missing, the config written (what was in it kept), twice the same."""
    import json
    import subprocess

    c = cluster()
    login = c["initialization_commands"][0]
    assert login.startswith("r=REGISTRY;") and "docker login" not in login
    for name, t in c["available_node_types"].items():
        assert t.get("initialization_commands", c["initialization_commands"])[0] == login, name
    registry = "123456789012.dkr.ecr.eu-central-1.amazonaws.com"
    env = fake_bin(tmp_path, sudo='echo "$@" >> "$HOME/sudo.log"')
    (tmp_path / "home" / ".docker").mkdir()
    (tmp_path / "home" / ".docker" / "config.json").write_text(json.dumps({"auths": {"ghcr.io": {}}}))
    cmd = login.replace("REGISTRY", registry)
    for _ in range(2):
        r = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    assert "apt-get install -y -qq amazon-ecr-credential-helper" in (tmp_path / "home" / "sudo.log").read_text()
    config = json.loads((tmp_path / "home" / ".docker" / "config.json").read_text())
    assert config == {"auths": {"ghcr.io": {}}, "credHelpers": {registry: "ecr-login"}}
    # where the helper is already installed, nothing is installed again
    env = fake_bin(tmp_path / "again", sudo='echo "$@" >> "$HOME/sudo.log"', **{"docker-credential-ecr-login": ""})
    assert subprocess.run(["bash", "-c", cmd], env=env, timeout=60).returncode == 0
    assert not (tmp_path / "again" / "home" / "sudo.log").exists()


def test_a_gpu_node_without_its_nvme_store_mounted_stops_with_a_clear_error(tmp_path):
    """The weights' folder is made on the instance store the AMI mounts at /opt/dlami/nvme; where nothing is mounted
    there, mkdir would put the weights on the root volume until it fills. Rehearsed in bash on a folder that is no
    mount point (refused, saying why) and on one that is (/dev/shm here: made, owned by the image's user)."""
    import subprocess

    cmd = next(x for x in cluster()["available_node_types"]["h100_worker"]["initialization_commands"]
               if "/opt/dlami/nvme" in x)
    env = fake_bin(tmp_path, sudo='"$@"', chown='echo "$@" >> "$HOME/chown.log"')
    plain = tmp_path / "not-mounted"
    plain.mkdir()
    r = subprocess.run(["bash", "-c", cmd.replace("/opt/dlami/nvme", str(plain))], env=env, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1 and "is not a mounted file system on this node" in r.stderr
    assert "weights would fill its root volume" in r.stderr and not (plain / "proxray-weights").exists()
    mounted = Path("/dev/shm")
    assert subprocess.run(["mountpoint", "-q", str(mounted)]).returncode == 0
    try:
        r = subprocess.run(["bash", "-c", cmd.replace("/opt/dlami/nvme", str(mounted))], env=env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert (mounted / "proxray-weights").is_dir()
        assert (tmp_path / "home" / "chown.log").read_text().split() == ["1000:100", f"{mounted}/proxray-weights"]
    finally:
        (mounted / "proxray-weights").rmdir()


def test_the_heads_gcs_namespace_is_its_instances_unless_the_env_file_names_one(tmp_path):
    """The head's start command gives Ray's GCS the namespace proxray-<the host's boot id>: the same after a restart
    on the instance (ray up --restart-only finds its tables), another on a new instance (ray down then ray up does
    not restore the last cluster's actors); one named in ~/.proxray/env wins. `proxray gcs-clean` works out the same
    name. Rehearsed in bash with a stand-in `ray` that prints what it was given."""
    import subprocess

    from proxray.common.gcs_storage import BOOT_ID, namespace

    (start,) = [x for x in cluster()["head_start_ray_commands"] if "ray start --head" in x]
    env = fake_bin(tmp_path, ray='echo "$RAY_external_storage_namespace"')
    said = [subprocess.run(["bash", "-c", start], env=env, capture_output=True, text=True, timeout=30).stdout.strip()
            for _ in range(2)]
    assert said == [f"proxray-{BOOT_ID.read_text().strip()}"] * 2 == [namespace({})] * 2
    (tmp_path / "home" / ".proxray").mkdir()
    (tmp_path / "home" / ".proxray" / "env").write_text("RAY_external_storage_namespace=mine\n")
    r = subprocess.run(["bash", "-c", start], env=env, capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == "mine" == namespace({"RAY_external_storage_namespace": "mine"})


def test_gpu_nodes_keep_weights_on_their_nvme_store_and_no_node_is_volta():
    types = cluster()["available_node_types"]
    gpus = {n: t for n, t in types.items() if any(k.startswith("accelerator_type:") for k in t.get("resources", {}))}
    assert set(gpus) == {"a100_worker", "h100_worker"}  # CUDA 13 (the image's torch and vLLM) has no Volta
    for name, t in gpus.items():
        opts = t["docker"]["worker_run_options"]
        assert "-v /opt/dlami/nvme/proxray-weights:/home/ray/weights" in opts and \
            "-e HF_HUB_CACHE=/home/ray/weights" in opts, name
        assert any("chown 1000:100 /opt/dlami/nvme/proxray-weights" in c for c in t["initialization_commands"]), name
        assert t["node_config"]["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] >= 150, name  # the image, unpacked
