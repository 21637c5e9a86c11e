"""Work a test needs that mostly waits on the network — a resolution from the package index, the installs of pinned
tools from npm and the package index — started in the background as soon as the session knows it will run a test that
needs it, so that it overlaps the tests before that one. The test waits for it and asserts on its result exactly as it
would on a run of its own; what runs is the same command. A module declares its work at import (``declare``); the
session starts what its selected tests need once they are collected (``start_needed``); a fixture waits
(``result``), starting the work then if nothing started it (under pytest-xdist a worker does not know which modules it
will get, so each starts its own on first use)."""
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str
    folder: Path  # where the work wrote what it made (an install, a report)


@dataclass
class _Work:
    needed_by: tuple  # node id prefixes of the tests that use it
    make: object  # folder -> (commands (run one after another, the next only if the last succeeded), env, cwd)
    proc: subprocess.Popen | None = None
    folder: Path | None = None


_works: dict = {}


def declare(name, needed_by, make):
    """``make(folder)`` -> ``(commands, env, cwd)``: each command a list of arguments; ``env`` None for this one's."""
    _works.setdefault(name, _Work(tuple(needed_by), make))


def _start(name):
    work = _works[name]
    if work.proc is None:
        work.folder = Path(tempfile.mkdtemp(prefix=f"proxray-{name}-"))
        commands, env, cwd = work.make(work.folder)
        script = " && ".join(shlex.join(map(str, c)) for c in commands)
        out, err = open(work.folder / ".stdout", "w"), open(work.folder / ".stderr", "w")
        work.proc = subprocess.Popen(["bash", "-c", script], env=env, cwd=cwd or work.folder, stdout=out, stderr=err,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        out.close(), err.close()
    return work


def start_needed(items):
    """Start, in the background, the work of every declared name that one of ``items`` (the selected tests) needs."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    ids = [item.nodeid for item in items]
    for name, work in _works.items():
        if any(i.startswith(p) for i in ids for p in work.needed_by):
            _start(name)


def result(name, timeout=1200) -> Done:
    """The work's end, waited for (``timeout``: a bound on a hang, not a timing)."""
    work = _start(name)
    try:
        code = work.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(work)
        raise AssertionError(f"{name}: still running after {timeout} s")
    return Done(code, (work.folder / ".stdout").read_text(), (work.folder / ".stderr").read_text(), work.folder)


def _stop(work):
    if work.proc is not None and work.proc.poll() is None:
        try:
            os.killpg(work.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        work.proc.wait()


def finish():
    """At the session's end: what still runs is stopped, the folders removed."""
    for work in _works.values():
        _stop(work)
        if work.folder is not None:
            shutil.rmtree(work.folder, ignore_errors=True)
