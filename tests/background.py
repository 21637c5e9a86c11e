"""Work a test needs that runs as commands of its own — a resolution from the package index, the installs of pinned
tools from npm and the package index, which mostly wait on the network; the user's install and main job, the cluster
journey, the GPU rehearsal and the drift demo's runs, each a process tree with a Ray of its own — started in the
background before the test that needs it, so that it overlaps the tests before that one: about its own duration before
it (not the session's start, where every such work at once slowed the first modules by as much as it saved), or with a
module named for it whose tests leave a core idle (``/proc/stat`` around each test: ``PROXRAY_TIMINGS_OUT``'s
``.busy.json``). Work with a Ray of its own runs in an environment of its own (``isolated_env``). The test waits for
it and asserts on its result exactly as it would on a run of its own; what runs is the same command. A module declares
its work at import (``declare``, with how long it takes); once the tests are collected, ``plan`` picks the module each
work starts with from each module's seconds in a full run (tests/timings.json); ``module_starts`` starts it there, and
holds a ``QUIET`` module (one a busy machine makes fail or crawl) until no work runs; a fixture waits (``result``),
starting the work then if nothing started it (under pytest-xdist a worker does not know which modules it will get, so
each starts its own on first use)."""
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
    seconds: float  # about how long it takes
    start_with: str | None = None  # the module it starts with, where it comes before the first test that needs it
    proc: subprocess.Popen | None = None
    folder: Path | None = None


_works: dict = {}


_plan: dict = {}  # module -> the works to start when its first test starts
_quieted: set = set()  # the QUIET modules that have waited (``module_starts``)


def declare(name, needed_by, make, seconds, start_with=None):
    """``make(folder)`` -> ``(commands, env, cwd)``: each command a list of arguments; ``env`` None for this one's.
    ``seconds``: about how long it takes, which is how far ahead of its first test it starts; ``start_with``: a module
    to start it with instead (one whose tests leave a core idle most of the time), where that module runs before the
    first test that needs the work."""
    _works.setdefault(name, _Work(tuple(needed_by), make, float(seconds), start_with))


# Work that runs a Ray, Serve or HAProxy of its own beside the suite's gets a Ray temp folder, HAProxy files and
# ingress replica ports of its own (as a second test worker does, tests/conftest.py): it never joins the suite's Ray by
# "auto", loads the suite's HAProxy config or answers the suite's requests; MARK tells its processes apart
# (tests/test_serve_stop.py counts the HAProxy processes the suite's own clusters left).
MARK = "PROXRAY_BACKGROUND_WORK"
_isolated: list = []


def front_of_its_own(haproxy_dir, index: int) -> dict:
    """The variables that give a Ray's Serve a front of its own on this machine: Serve's HAProxy files in
    ``haproxy_dir`` (its config, admin and metrics sockets and server state: /tmp/haproxy-serve by default, where one
    Serve's reload would load another's config) and block ``index`` (0–16) of 100 ingress replica ports (bound with
    SO_REUSEPORT: two Serves handing out the same port would answer each other's requests), outside the blocks that
    the clusters proxray's commands start take (``proxray.serve.front.ingress_ports``: 30000–31000, 40000–41000) and
    under the system's ephemeral range (32768 on, where any client connection may hold a port a replica then cannot
    bind)."""
    out = {var: os.path.join(haproxy_dir, leaf).rstrip("/") for var, leaf in {
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "haproxy.cfg", "RAY_SERVE_HAPROXY_SOCKET_PATH": "admin.sock",
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": "", "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": "server-state",
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": "metrics.sock"}.items()}
    for proto, base in (("HTTP", 31000), ("GRPC", 41000)):
        out[f"RAY_SERVE_DIRECT_INGRESS_MIN_{proto}_PORT"] = str(base + 100 * index)
        out[f"RAY_SERVE_DIRECT_INGRESS_MAX_{proto}_PORT"] = str(base + 100 * index + 99)
    return out


BACKGROUND_SLOTS = 12  # background works running at once with blocks of ports of their own


def free_ports_of_its_own(index: int, workers: int = 0) -> str:
    """The range ``proxray.serve.front.free_port`` draws from (``PROXRAY_FREE_PORTS``) in one test worker of
    ``workers`` (20000–23999 split between them) or, ``workers=0``, in background slot ``index`` (0 to
    ``BACKGROUND_SLOTS`` - 1: 24000–29999 in blocks of 500): a port one process chose is free until that process binds
    it, often a minute later (a Serve's HTTP port after a job and a fit); another process drawing from the same range
    could choose it meanwhile and then answer the first one's requests."""
    if workers:
        size = 4000 // workers
        return f"{20000 + size * index}-{20000 + size * (index + 1) - 1}"
    low = 24000 + 500 * index
    return f"{low}-{low + 499}"


def isolated_env(name: str, env: dict | None = None) -> dict:
    """``env`` (default this process's) for a work that runs its own Ray and Serve beside the suite's."""
    from proxray.serve.front import node_ports

    index = len(_isolated) + 1
    folder = Path(tempfile.mkdtemp(prefix=f"rb{index}-", dir="/tmp"))  # short: Unix socket paths are bounded
    _isolated.append(folder)
    (folder / "hs").mkdir()
    # the test workers' own Serves take the first blocks of ingress ports (tests/conftest.py); HAProxy's stats and
    # metrics ports: free ones, not the suite's
    slot = (index - 1) % BACKGROUND_SLOTS  # its free ports and its ingress block (after the test workers' and spares)
    return {**(os.environ if env is None else env), MARK: name, "RAY_TMPDIR": str(folder),
            "PROXRAY_FREE_PORTS": free_ports_of_its_own(slot), **front_of_its_own(folder / "hs", 5 + slot),
            **node_ports()}


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


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def plan(items, seconds: dict):
    """For each declared work one of ``items`` (the selected tests, in their order) needs: the module it starts with,
    the latest whose start is at least the work's duration before the first test that needs it (``seconds``: each
    module's seconds in a full run; a module not listed counts 1 s)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    modules = list(dict.fromkeys(_module(i.nodeid) for i in items))
    starts, t = {}, 0.0
    for m in modules:
        starts[m] = t
        t += seconds.get(m, 1.0)
    for name, work in _works.items():
        first = next((i for i in items if i.nodeid.startswith(work.needed_by)), None)
        if first is not None:
            if work.start_with in starts and starts[work.start_with] <= starts[_module(first.nodeid)]:
                at = work.start_with
            else:
                due = starts[_module(first.nodeid)] - work.seconds
                at = [m for m in modules if starts[m] <= max(due, 0.0)][-1]
            # not with a QUIET module: with the next one that is not (or the one that needs it)
            while at in QUIET and at != _module(first.nodeid):
                at = modules[modules.index(at) + 1]
            _plan.setdefault(at, []).append(name)


# The modules whose tests bound a latency or a failover (a replica, a node or the head killed under load, the limiter's
# windows, the reliability soak's answers within the app's 3-s timeout, a two-node cluster's start, a model scaled up
# under routed load, a router rolled back under it) or keep both cores busy with torch's or vLLM's threads (which a
# process beside them slows several times over: the static encoder's module took 152 s, alone 24), or start a Ray
# again and again (``proxray serve`` stopped and started: each raylet must register within Ray's fixed 30 s, which a
# start beside the GPU rehearsal once missed): none starts while a background work still runs
# (``module_starts`` waits for it to end), and none starts one (a work planned there starts with the module after).
QUIET = {"tests/test_cluster_serve.py", "tests/test_replica_restarts.py", "tests/test_serve.py", "tests/test_gate.py",
         "tests/test_reliability.py", "tests/test_tenancy.py", "tests/test_static_encoder.py",
         "tests/test_vllm_serve.py", "tests/test_head_loss.py", "tests/test_node_loss.py", "tests/test_vllm_endpoint.py",
         "tests/test_vllm_job.py", "tests/test_serve_stop.py"}


def _running() -> list:
    return [w for w in _works.values() if w.proc is not None and w.proc.poll() is None]


def module_starts(nodeid: str, timeout=1200):
    """A test is about to run: the works planned for its module, started (once); in a ``QUIET`` module, the works that
    still run waited for first (``timeout``: a bound on a hang, not a timing)."""
    import time

    module = _module(nodeid)
    if module in QUIET and module not in _quieted:
        _quieted.add(module)
        deadline = time.monotonic() + timeout
        for work in _running():
            try:
                work.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    for name in _plan.pop(module, []):
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
    for folder in _isolated:
        shutil.rmtree(folder, ignore_errors=True)
