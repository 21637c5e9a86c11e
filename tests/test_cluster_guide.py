"""docs/guides/deploy-on-a-cluster.md against the files it names: every path exists, the commands it gives match
the ones the files carry, the quota it asks for is what serving and the monitor's evaluations take on the node
types cluster.yaml starts, and the Kubernetes steps come in an order that works (the router before the service)."""
import math
import re
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_gpu_configs import demand  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "guides" / "deploy-on-a-cluster.md").read_text()
VCPUS = {"p5.48xlarge": 192, "p4de.24xlarge": 96}


def test_every_file_the_guide_names_exists():
    named = set(re.findall(r"\]\(\.\./\.\./([^)#]+)\)", GUIDE))
    named |= {p for p in re.findall(r"`((?:jobs|serve_configs|monitor_configs|deploy)/[\w./-]+\.(?:yaml|py))`", GUIDE)}
    named |= set(re.findall(r"--config ((?:jobs/configs|serve_configs|monitor_configs)/\S+\.yaml)", GUIDE))
    assert len(named) > 8
    assert [p for p in sorted(named) if not (ROOT / p).exists()] == []


def test_the_hugging_face_login_is_the_installed_clis():
    assert "hf auth login" in GUIDE and "huggingface-cli" not in GUIDE + (ROOT / "cluster.yaml").read_text()
    hf = Path(sys.executable).with_name("hf")
    r = subprocess.run([str(hf), "auth", "login", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "token" in r.stdout.lower()


def test_the_quota_is_serving_plus_an_evaluation_on_cluster_yamls_node_types():
    c = yaml.safe_load((ROOT / "cluster.yaml").read_text())["available_node_types"]
    for kind, node in (("H100", "h100_worker"), ("A100", "a100_worker")):
        t = kind.lower()
        per_node = c[node]["resources"][f"accelerator_type:{kind}"]
        nodes = math.ceil(demand(ROOT / "serve_configs" / f"paper_pool_{t}.yaml")[kind] / per_node) + \
            math.ceil(demand(ROOT / "monitor_configs" / f"paper_pool_{t}.yaml")[kind] / per_node)
        vcpus = nodes * VCPUS[c[node]["node_config"]["InstanceType"]]
        assert re.search(rf"{kind} \*\*{vcpus}( vCPUs)?\*\*", GUIDE), (kind, vcpus)
    assert "v100_worker" not in c and "V100 **" not in GUIDE  # no V100 node type: CUDA 13 has no Volta


def test_the_guide_says_what_each_journey_costs_and_takes_on_its_first_screen():
    aws = GUIDE[:GUIDE.index("## 0. Prerequisites")]
    k8s = GUIDE[GUIDE.index("## On Kubernetes (KubeRay)"):]
    k8s = k8s[:k8s.index("**Prerequisites**")]
    for first in (aws, k8s):
        assert "**What it costs and how long it takes.**" in first and "per hour" in first and "takes" in first
        assert "p5.48xlarge" in first and "2026-12-01" in first  # list prices, dated


def test_the_kubernetes_steps_fit_the_router_before_the_service_starts():
    k8s = GUIDE[GUIDE.index("## On Kubernetes (KubeRay)"):]
    order = [k8s.index(s) for s in ("docker build -f deploy/Dockerfile", "kubectl create secret generic "
                                    "proxray-api-key", "kubectl apply -f deploy/kuberay/rayjob.yaml",
                                    "kubectl wait --for=jsonpath='{.status.jobStatus}'=SUCCEEDED rayjob/proxray-tables",
                                    "kubectl apply -f deploy/kuberay/rayservice.yaml")]
    assert order == sorted(order)
    job = yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayjob.yaml").read_text())
    assert job["metadata"]["name"] == "proxray-tables"
    docker = (ROOT / "deploy" / "Dockerfile").read_text()
    build = re.search(r"docker build .*", k8s).group(0)
    assert build in docker  # the guide's build command is the Dockerfile's
    # the secrets the guide creates are the ones the manifests mount, with the keys they read
    for name in ("rayjob.yaml", "rayservice.yaml"):
        text = (ROOT / "deploy" / "kuberay" / name).read_text()
        for secret, key in (("proxray-api-key", "api_key"), ("hf-token", "token")):
            assert f"secretName: {secret}" in text and f"kubectl create secret generic {secret} --from-file={key}=" in k8s


def test_the_monitor_commands_work_as_written():
    """`ray exec cluster.yaml 'proxray monitor status'` runs in a shell that sources ~/.bashrc, which cluster.yaml
    makes export RAY_AUTH_MODE=token (run on a cluster in tests/test_monitor_on_a_cluster.py)."""
    assert "ray exec cluster.yaml 'proxray monitor status'" in GUIDE
    setup = yaml.safe_load((ROOT / "cluster.yaml").read_text())["setup_commands"]
    assert any("export RAY_AUTH_MODE=token" in c and "~/.bashrc" in c for c in setup)


# what the AWS CLI adds to an operation beyond its API's parameters (awscli's customizations), for those the guides use
AWS_CUSTOM = {("ec2", "authorize-security-group-ingress"): {"protocol", "port", "cidr", "source-group", "group-owner"},
              ("ecr", "get-login-password"): set(), ("s3", "mb"): set(), ("eks", "update-kubeconfig"): {
                  "name", "kubeconfig", "role-arn", "alias", "user-alias", "dry-run", "verbose"}}
AWS_GLOBAL = {"region", "query", "output", "profile", "endpoint-url", "no-cli-pager", "debug", "no-paginate",
              "cli-input-json", "generate-cli-skeleton", "max-items", "starting-token", "page-size"}


def aws_commands(text: str) -> list:
    """(service, operation or ``wait WAITER``, its --flags) of every `aws` command in a Markdown page's shell blocks and
    inline code; a command inside ``$(…)`` is its own, not its host's."""
    blocks = [b for lang, b in re.findall(r"```([a-z]*)\n(.*?)```", text, re.S) if lang in ("bash", "sh", "")]
    src = "\n".join(blocks + re.findall(r"`(aws [^`]+)`", text)).replace("\\\n", " ")
    out = []
    for line in src.splitlines():
        line = line.split(" #")[0]
        for m in re.finditer(r"(?<![\w/-])aws\s+([a-z0-9-]+)\s+([a-z0-9-]+)(?:\s+([a-z0-9-]+))?", line):
            rest, depth, i, quote = line[m.end(2):], 0, 0, None
            while i < len(rest):  # up to the end of this command: a pipe, ;, &&, or the ) closing its $(
                ch = rest[i]
                if quote:
                    quote = None if ch == quote else quote
                elif ch in "'\"":
                    quote = ch
                elif rest.startswith("$(", i):
                    depth, i = depth + 1, i + 1
                elif ch == ")":
                    if depth == 0:
                        break
                    depth -= 1
                elif depth == 0 and (ch in "|;`" or rest.startswith("&&", i)):
                    break
                i += 1
            own = re.sub(r"'[^']*'|\"[^\"]*\"", " ", re.sub(r"\$\((?:[^()]|\([^()]*\))*\)", " ", rest[:i]))
            op = f"wait {m.group(3)}" if m.group(2) == "wait" else m.group(2)
            out.append((m.group(1), op, re.findall(r"(?<!\S)--([a-z0-9-]+)", own)))
    return out


def aws_flags(session, service: str, op: str):
    """The flags the AWS CLI takes for ``aws SERVICE OP`` (from botocore's models, which the CLI is generated from),
    or None where it has no such operation or waiter."""
    from botocore import xform_name

    custom = AWS_CUSTOM.get((service, op))
    model = session.get_service_model(service)
    if op.startswith("wait "):
        waiters = session.get_waiter_model(service)
        names = {xform_name(n, "-"): n for n in waiters.waiter_names}
        if op[5:] not in names:
            return None
        op_name = waiters.get_waiter(names[op[5:]]).operation
    else:
        names = {xform_name(n, "-"): n for n in model.operation_names}
        if op not in names:
            return None if custom is None else custom | AWS_GLOBAL  # a command only the CLI has
        op_name = names[op]
    shape = model.operation_model(op_name).input_shape
    flags = AWS_GLOBAL | (custom or set())
    for name, member in (shape.members.items() if shape else ()):
        flags.add(xform_name(name, "-"))
        if member.type_name == "boolean":
            flags.add("no-" + xform_name(name, "-"))
    return flags


def test_every_aws_command_in_the_guides_is_one_the_aws_cli_takes():
    """Each `aws` command of the cluster guide and the operations pages names an operation (or waiter) the AWS CLI has
    and only flags it takes — read from botocore's service models, what the CLI is generated from."""
    import botocore.session

    session = botocore.session.get_session()
    pages = [ROOT / "docs" / "guides" / "deploy-on-a-cluster.md", *sorted((ROOT / "docs" / "operations").glob("*.md"))]
    found, bad = 0, []
    for page in pages:
        for service, op, flags in aws_commands(page.read_text()):
            found += 1
            allowed = aws_flags(session, service, op)
            if allowed is None:
                bad.append(f"{page.name}: aws {service} {op}: no such operation")
            elif set(flags) - allowed:
                bad.append(f"{page.name}: aws {service} {op}: no flag {sorted(set(flags) - allowed)}")
    assert found >= 20 and bad == [], bad
    # the check itself refuses what the CLI refuses
    assert aws_flags(session, "efs", "create-file-system") >= {"encrypted", "no-encrypted", "throughput-mode"}
    assert "node-taints" not in (aws_flags(session, "eks", "create-nodegroup") or set())
    assert aws_flags(session, "eks", "wait addon-active") >= {"cluster-name", "addon-name"}
    assert aws_flags(session, "eks", "create-node-group") is None


def eksctl_commands(text: str) -> list:
    """(command, its flags) of every `eksctl` command in a Markdown page's shell blocks and inline code: the command
    its first two words (``create nodegroup``), each flag as written without its dashes (``--region`` -> region)."""
    blocks = [b for lang, b in re.findall(r"```([a-z]*)\n(.*?)```", text, re.S) if lang in ("bash", "sh", "")]
    inline = [c.replace("\n", " ") for c in re.findall(r"`(eksctl [^`]+)`", text)]  # one command, broken over lines
    src = "\n".join(blocks + inline).replace("\\\n", " ")
    out = []
    for line in src.splitlines():
        for m in re.finditer(r"(?<![\w/-])eksctl\s+([a-z-]+)\s+([a-z-]+)([^;&|#]*)", line.split(" #")[0]):
            flags = [f.split("=")[0] for f in re.findall(r"(?:^|\s)--?([A-Za-z][\w-]*(?:=\S*)?)", m.group(3))]
            out.append((f"{m.group(1)} {m.group(2)}", flags))
    return out


def test_every_eksctl_command_in_the_guides_is_one_eksctl_takes():
    """Each `eksctl` command of the cluster guide and the operations pages is one eksctl has, with only flags it takes —
    read from eksctl's own source at the tag tests/data/eksctl/flags.json names (its build_flags.py)."""
    import json

    known = json.loads((ROOT / "tests" / "data" / "eksctl" / "flags.json").read_text())
    pages = [ROOT / "docs" / "guides" / "deploy-on-a-cluster.md", *sorted((ROOT / "docs" / "operations").glob("*.md"))]
    found, bad = 0, []
    for page in pages:
        for command, flags in eksctl_commands(page.read_text()):
            found += 1
            allowed = known["commands"].get(command)
            if allowed is None:
                bad.append(f"{page.name}: eksctl {command}: not one of the commands checked ({', '.join(known['commands'])})")
            elif set(flags) - set(allowed):
                bad.append(f"{page.name}: eksctl {command}: no flag {sorted(set(flags) - set(allowed))}")
    assert found >= 4 and bad == [], bad
    # the check refuses what eksctl refuses: taints are not a flag of `create nodegroup` (a ClusterConfig's field)
    assert "node-taints" not in known["commands"]["create nodegroup"] and "f" in known["commands"]["create nodegroup"]
    assert {"cluster", "region", "approve"} <= set(known["commands"]["utils associate-iam-oidc-provider"])
    assert eksctl_commands("```bash\neksctl create nodegroup --cluster c --node-taints a=b:NoSchedule\n```") == [
        ("create nodegroup", ["cluster", "node-taints"])]
