"""Resolve and write the locked versions ``install.sh`` installs, one file per platform.

    python constraints/lock.py                 # every platform: dev first, each other one within another lock
    python constraints/lock.py gpu             # one platform, within the dev lock already written
    python constraints/lock.py v100            # the V100 path's torch, laid over the gpu lock

pip itself resolves them (``pip install --dry-run --ignore-installed --report``, in a scratch venv of the Python
that runs this script), so the lock is what ``pip install`` would choose today, written down. ``dev`` (vLLM's CPU
build and the test tools: what CI installs and tests) is resolved first; ``cpu`` and ``vllm-cpu`` are resolved
*under* it (``-c dev.txt``), so every version a user of those platforms gets is one the whole test suite ran
against. ``gpu`` (the CUDA build of vLLM through ``ray[llm]``, which CI cannot install) is resolved under the dev
lock too, but the CUDA build's own pins conflict with a few of it (``apache-tvm-ffi``, ``protobuf``): each pin pip
names as the conflict is released, one at a time, and listed in the lock's header; everything else it shares with
dev (numpy, torch, ray, pandas, ...) is dev's, as tested.

The CPU platforms are resolved with PyTorch's CPU build (``torch==2.13.0+cpu``, which vLLM's CPU build needs and which
carries no CUDA libraries or triton): run it where pip can find that build (``PIP_EXTRA_INDEX_URL=
https://download.pytorch.org/whl/cpu``), or it stops and says so. ``gpu`` is resolved from the package index alone
(``PIP_CONFIG_FILE`` set to the null device, no extra index or find-links), which serves the CUDA build, as a GPU node
gets it. Local version labels are dropped in the files (``torch==2.13.0``): the CPU and CUDA builds of one release
are the same version to pip, and each machine takes the build its index serves.

``v100`` is not an install: it is what the V100 path (``jobs/configs/paper_pool_v100.yaml``) lays over the gpu image
in a Ray ``runtime_env`` — torch 2.10.0, the package index's CUDA 12.8 build, the last torch line with Volta (sm_70)
kernels, and the CUDA libraries it needs. It is resolved whole within gpu.txt (the transformers engine's
``torch``, ``transformers`` and ``sentence-transformers``, every other pin of gpu.txt held, torch's own CUDA
libraries released), and v100.txt holds what differs from gpu.txt: the runtime_env's packages. Standard library only.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PLATFORMS = {"dev": "[dev,vllm-cpu]", "cpu": "", "vllm-cpu": "[vllm-cpu]", "gpu": "[gpu]"}  # as install.sh names them
WITHIN = {"dev": None, "cpu": "dev", "vllm-cpu": "dev", "gpu": "dev"}  # the lock each is resolved under
TORCH_BUILD = {"dev": "+cpu", "cpu": "+cpu", "vllm-cpu": "+cpu", "gpu": ""}  # the local label each is resolved with
# overlays: (what is asked for, the pins of the lock within that are released for it: a pattern of names)
OVERLAYS = {"v100": (["torch==2.10.0", "transformers", "sentence-transformers"], r"(torch|triton|nvidia-.*|cuda-.*)")}
WITHIN["v100"], TORCH_BUILD["v100"] = "gpu", ""
ORDER = [*PLATFORMS, *OVERLAYS]
HEADER = """\
# Locked versions for `bash install.sh {platform}` (pip {pip}, CPython {python}, {system}); install.sh installs with
# `pip install -c` this file. Resolved {within}on {date}. Refresh: python constraints/lock.py
# (tests/test_locks.py checks that every lock still satisfies pyproject.toml).
"""


OVERLAY_HEADER = """\
# What the {platform} path lays over {within}.txt in a Ray runtime_env: {asked}, resolved whole
# within {within}.txt (pip {pip}, CPython {python}, {system}) on {date}, torch's own CUDA libraries released;
# the pins below are those that differ from {within}.txt. Refresh: python constraints/lock.py {platform}
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(python: Path, platform: str, within: dict[str, str]) -> tuple[dict[str, str], dict, list[str]]:
    """{distribution: version} pip would install for ``platform`` into an empty environment held to the pins
    ``within``, pip's report's ``environment``, and the pins of ``within`` that had to be released: where pip names a
    pin as the conflict (``The user requested (constraint) x==1``), that one pin is dropped and pip asked again."""
    overlay = OVERLAYS.get(platform)
    released = sorted(n for n in within if re.fullmatch(overlay[1], n)) if overlay else []
    spec = overlay[0] if overlay else ["-e", f"{ROOT}{PLATFORMS[platform]}"]
    env = dict(os.environ)
    if not TORCH_BUILD[platform]:  # the package index alone: its torch is the CUDA build
        env = {k: v for k, v in env.items() if k not in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL",
                                                         "PIP_CONSTRAINT")}
        env["PIP_CONFIG_FILE"] = os.devnull
    with tempfile.TemporaryDirectory() as tmp:
        report, constraints = Path(tmp) / "report.json", Path(tmp) / "within.txt"
        while True:
            constraints.write_text("".join(f"{n}=={v}\n" for n, v in within.items() if n not in released))
            done = subprocess.run([str(python), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--report",
                                   str(report), "-c", str(constraints), *spec],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            if not done.returncode:
                break
            pinned = conflicting_pins(done.stdout, within) - set(released)
            if not pinned:  # a conflict of the requirements themselves: pip's explanation
                sys.exit("lock.py: pip could not resolve {}:\n{}".format(
                    " ".join(spec), done.stdout[done.stdout.find("ERROR"):]))
            released += sorted(pinned)
        data = json.loads(report.read_text())
    found = {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in data["install"]}
    torch_build = found["torch"][len(found["torch"].split("+", 1)[0]):]
    if torch_build != TORCH_BUILD[platform]:
        sys.exit(f"lock.py: {platform} is locked with torch{TORCH_BUILD[platform] or ' from the package index'}, "
                 f"but pip found torch {found['torch']}" + ("; let it find PyTorch's CPU build: PIP_EXTRA_INDEX_URL="
                                                          "https://download.pytorch.org/whl/cpu python constraints/lock.py"
                                                          if TORCH_BUILD[platform] else ""))
    pins = {name: version.split("+", 1)[0] for name, version in found.items() if name != "proxray"}
    return pins, {**data["environment"], "pip": data["pip_version"]}, released


def conflicting_pins(pip_output: str, within: dict[str, str]) -> set[str]:
    """The pins of ``within`` that pip's explanation of a conflict names: a pin it calls a constraint
    (``The user requested (constraint) x==1``), or a pinned distribution whose own requirements are part of the conflict
    (``x 1 depends on ...``), unless pyproject.toml pins that one itself (those stay as they are either way)."""
    exact = {canonical(n) for n in re.findall(r'"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==', (ROOT / "pyproject.toml").read_text())}
    named = re.findall(r"The user requested \(constraint\) ([A-Za-z0-9_.-]+)==", pip_output)
    named += [n for n in re.findall(r"^\s+([A-Za-z0-9_.-]+)(?:\[[^\]]*\])? \S+ depends on ", pip_output, flags=re.M)
              if canonical(n) not in exact]
    return {canonical(n) for n in named} & set(within)


def read(path: Path) -> dict[str, str]:
    """The pins of a lock file."""
    return dict(ln.split("==", 1) for ln in path.read_text().splitlines() if ln and not ln.startswith("#"))


def write(platform: str, pins: dict[str, str], env: dict, within: str | None, released: list[str]) -> Path:
    path = HERE / f"{platform}.txt"
    if platform in OVERLAYS:  # what differs from the lock it is laid over
        base = read(HERE / f"{within}.txt")
        pins = {n: v for n, v in pins.items() if base.get(n) != v}
        head = OVERLAY_HEADER.format(platform=platform, pip=env["pip"], python=env["python_full_version"],
                                     system=f"{env['sys_platform']} {env['platform_machine']}", within=within,
                                     asked=" ".join(OVERLAYS[platform][0]), date=time.strftime("%Y-%m-%d"))
        path.write_text(head + "".join(f"{n}=={pins[n]}\n" for n in sorted(pins)))
        return path
    head = HEADER.format(platform=platform, pip=env["pip"], python=env["python_full_version"],
                         system=f"{env['sys_platform']} {env['platform_machine']}",
                         within=f"within {within}.txt " if within else "", date=time.strftime("%Y-%m-%d"))
    if released:
        head += f"# released from {within}.txt (this platform's own requirements conflict with its pins): " \
                f"{', '.join(released)}\n"
    path.write_text(head + "".join(f"{n}=={pins[n]}\n" for n in sorted(pins)))
    return path


def main(argv: list[str]) -> int:
    wanted = argv or ORDER
    unknown = [p for p in wanted if p not in ORDER]
    if unknown:
        print(f"lock.py: unknown platform {', '.join(unknown)} (known: {', '.join(ORDER)})", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "venv", tmp], check=True)
        python = Path(tmp) / "bin" / "python"
        for platform in sorted(wanted, key=ORDER.index):  # each after the lock it is resolved within
            start, within = time.monotonic(), WITHIN[platform]
            if within and not (HERE / f"{within}.txt").is_file():
                print(f"lock.py: {within}.txt is missing: lock {within} first", file=sys.stderr)
                return 2
            pins, env, released = resolve(python, platform, read(HERE / f"{within}.txt") if within else {})
            path = write(platform, pins, env, within, released)
            print(f"{path.relative_to(ROOT)}: {len(pins)} distributions (numpy {pins.get('numpy')}, torch "
                  f"{pins.get('torch')}, ray {pins.get('ray')}) in {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
