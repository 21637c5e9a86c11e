import os
from pathlib import Path

import numpy as np
import pytest

import background

# Offline and local-only, for every test and every process the tests start.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The stand-in provider key the test apps read from their environment (``api_key_env``), set once for the session: a
# Ray that started before a module set it would not pass it to that module's app (tests/serve_helpers.py shares one)
os.environ.setdefault("PROXRAY_TEST_KEY", "sk-test-not-a-real-key-123")
os.environ.setdefault("PROXRAY_RESP_KEY", "sk-test-not-a-real-key-123")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of LiteLLM's price list at its import
# NumPy 2.4 refuses float()/int() of an array with ndim > 0, which NumPy 2.3 only warns about: an error in every
# process the tests start too (Ray workers, Serve replicas, the CLI), as it is for users on NumPy 2.4
NDIM_SCALAR = "error:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), NDIM_SCALAR]))

# Two test workers (pytest-xdist, as CI runs the suite) each start their own local Ray clusters: each gets a Ray
# temp folder of its own, so the session a CLI joins by ``address="auto"`` (Ray's ray_current_cluster file), the
# session_latest link and the sockets are that worker's, never the other's, and this run's, never an earlier run's.
# Short: Unix socket paths are bounded.
if os.environ.get("PYTEST_XDIST_WORKER"):
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")[:6]
    os.environ.setdefault("RAY_TMPDIR", f"/tmp/ray-{os.environ['PYTEST_XDIST_WORKER']}-{run_id}")
    os.makedirs(os.environ["RAY_TMPDIR"], exist_ok=True)
    # Serve's HAProxy files and the ingress replicas' ports: each worker's own (tests/background.py)
    front_dir = f"/tmp/hs-{os.environ['PYTEST_XDIST_WORKER']}-{run_id}"
    os.makedirs(front_dir, exist_ok=True)
_xdist = bool(os.environ.get("PYTEST_XDIST_WORKER"))
_worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
# the ports free_port draws (Serve's HTTP port, HAProxy's, a dashboard's): this process's own range, so that no work
# running beside it chooses one it chose before either binds it
os.environ.setdefault("PROXRAY_FREE_PORTS", background.free_ports_of_its_own(_worker, workers=2 if _xdist else 1))
for _name, _value in background.front_of_its_own(front_dir if _xdist else "", _worker).items():
    if _xdist or _name.startswith("RAY_SERVE_DIRECT_INGRESS"):  # one process alone keeps Serve's own HAProxy folder
        os.environ.setdefault(_name, _value)

# The serving front users' clusters run (Serve's HAProxy ingress, proxray.serve.front) for every Ray cluster the tests
# start; its ingress replicas hold on for 2 s when they stop (Ray's default, 30 s, is for a load balancer elsewhere to
# drop them; here HAProxy is on the same machine), so a test's Serve shuts down in seconds
from proxray.serve.front import front_env, node_ports  # noqa: E402
from ray_ports import take_ray_ports_from_the_system  # noqa: E402

take_ray_ports_from_the_system()

os.environ.update(front_env())
os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "2")
# Serve calls a proxy (its HAProxy manager) that is not ready within 5 s of starting unhealthy and kills it; on two
# busy cores shared by two test workers a start can take longer: a bound on a hang here, not a timing
os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "30")


def _fresh_front_ports():
    """The front's fixed ports (HAProxy's stats and metrics, Serve's fallback proxy), free ones, for the clusters
    started next: the last cluster's HAProxy may still hold its own while it exits, and a fallback proxy on a port
    another Serve's holds too would answer that Serve's requests (what ``front_env(local=True)`` does for users' local
    clusters)."""
    os.environ.update(node_ports())


@pytest.fixture(scope="module", autouse=True)
def _front_ports_per_module():
    _fresh_front_ports()  # before the module's own fixtures start a cluster (autouse fixtures come first in a scope)


@pytest.fixture(autouse=True)
def _front_ports_per_test():
    _fresh_front_ports()


@pytest.fixture(scope="module", autouse=True)
def _serve_left_running(request):
    """The Ray and Serve that ``start_app`` leaves running after a module (tests/serve_helpers.py) reach the next module
    only where that one starts its apps the same way; any other starts with none running."""
    if "start_app(" not in Path(request.module.__file__).read_text():
        import serve_helpers

        serve_helpers.release()

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    assert SHARED_DATA.is_dir(), f"{SHARED_DATA} is missing: tests need ../shared/data beside the repo"
    return SHARED_DATA


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
    os.environ["PROXRAY_CACHE"] = str(tmp_path_factory.mktemp("proxray-cache"))


@pytest.fixture(scope="session")
def encoder():
    from proxray import SentenceEncoder

    return SentenceEncoder()


def _start_local_ray():
    import ray

    import serve_helpers

    serve_helpers.release()
    _fresh_front_ports()
    # metrics exported every second (Ray's default: every 10 s), for the tests that read them
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             _system_config={"metrics_report_interval_ms": 1000})


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray (4 CPUs, no dashboard) for a whole test module; Ray's token auth is off for it (above)."""
    import ray

    _start_local_ray()
    yield
    ray.shutdown()


@pytest.fixture
def fresh_ray():
    """A local Ray for one test, shut down after it."""
    import ray

    _start_local_ray()
    yield
    ray.shutdown()


@pytest.fixture
def s3(monkeypatch):
    """A real S3 API (moto's server) on 127.0.0.1 with a bucket ``runs``: (a URI of a folder in it naming the
    endpoint, a boto3 client to look inside, the endpoint URL). Credentials are test ones, set for this test."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1")
    client.create_bucket(Bucket="runs")
    yield f"s3://runs/job?endpoint_override={host}:{port}&scheme=http&region=us-east-1", client, f"http://{host}:{port}"
    for o in client.list_objects_v2(Bucket="runs").get("Contents", []):  # moto keeps its state in the process
        client.delete_object(Bucket="runs", Key=o["Key"])
    client.delete_bucket(Bucket="runs")
    server.stop()


@pytest.fixture
def rng():
    return np.random.default_rng(42)


def blobs(rng, n_per=60, centers=4, dim=16, spread=0.05, models=3):
    """Clustered unit vectors whose best model depends on the cluster: (X, acc, cost, labels)."""
    C = rng.normal(size=(centers, dim))
    C /= np.linalg.norm(C, axis=1, keepdims=True)
    labels = np.repeat(np.arange(centers), n_per)
    X = C[labels] + spread * rng.normal(size=(len(labels), dim))
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    skill = rng.uniform(0.1, 0.9, size=(centers, models))
    acc = (rng.uniform(size=(len(labels), models)) < skill[labels]).astype(float)
    cost = np.tile(np.linspace(1.0, 3.0, models), (len(labels), 1)) * rng.uniform(0.9, 1.1, size=(len(labels), models))
    return X, acc, cost, labels


# How the suite runs in two workers (``-n 2``, not CI's default: README). A module is one unit of work (its module-scoped
# app, cluster or engine starts once, on one worker), except the modules that keep a core busy for most of their time
# (vLLM engines, Ray Data jobs, installs, lock resolutions: ONE_LANE), which are one unit together: they run one after
# another on one worker, never two at once, while the other worker takes the rest a module at a time, longest first
# (tests/timings.json: each module's seconds in a full run; one not listed counts as short), and the first worker
# takes what is left once its lane is done.
TIMINGS = Path(__file__).with_name("timings.json")
ONE_LANE = {"tests/test_monitor.py", "tests/test_vllm_endpoint.py", "tests/test_rehearsal.py", "tests/test_vllm_job.py",
            "tests/test_vllm_serve.py", "tests/test_user_paths.py", "tests/test_locks.py"}


def _unit(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return "one lane" if module in ONE_LANE else module


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run without xdist has no such hook
def pytest_xdist_make_scheduler(config, log):
    """The controller's scheduler: xdist's by scope (a unit goes to a worker whole, a worker takes the next unit
    when its own is almost done), with the scope above."""
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return Lanes(config, log)


# Modules whose apps start a Ray of their own settings (a metrics port, a proxy timeout, tracing on, object-store
# credentials, a path for the replicas): in one process they run after the modules that share one (below)
SERVE_OF_THEIR_OWN = ("tests/test_gateway.py", "tests/test_reference.py", "tests/test_reliability.py",
                      "tests/test_tenancy.py", "tests/test_tracing.py", "tests/test_uris.py", "tests/test_vllm_serve.py")


def _starts_apps(module: str) -> bool:
    return "start_app(" in (ROOT / module).read_text()


def _modules_that_start_apps_together(items) -> None:
    """One process: the modules that start their apps with ``start_app`` one after another, where the first of them
    was, those that can share one Ray and Serve first (tests/serve_helpers.py); in each group the modules a background
    work may run beside first and the ``QUIET`` ones after them (tests/background.py), so that a work started in the
    group runs beside a stretch of modules that leave a core idle instead of stopping at the next quiet one; the other
    quiet modules right after the last group, so that the modules after them hold no quiet one that would wait for a
    work started there; each in file order; the other modules in their own order around them."""
    modules = list(dict.fromkeys(it.nodeid.split("::", 1)[0] for it in items))
    apps = [m for m in modules if _starts_apps(m)]
    if not apps:
        return
    apps = [m for own in (False, True) for quiet in (False, True) for m in apps
            if (m in SERVE_OF_THEIR_OWN) == own and (m in background.QUIET) == quiet]
    apps += [m for m in modules if m in background.QUIET and m not in apps]  # every quiet module in one stretch
    first = modules.index(next(m for m in modules if m in apps))
    rest = [m for m in modules if m not in apps]
    order = {m: i for i, m in enumerate(rest[:first] + apps + rest[first:])}
    items.sort(key=lambda it: order[it.nodeid.split("::", 1)[0]])  # stable: a module's own order kept


# Modules whose test only asserts on a background work's result (tests/background.py), in one process: run last, so
# that the work can run beside the modules before them that leave a core idle and end before it is asked for
LAST = ("tests/test_rehearsal.py",)


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _modules_that_start_apps_together(items)
        items.sort(key=lambda it: it.nodeid.split("::", 1)[0] in LAST)  # stable: the rest in their order
        return
    import json

    seconds = json.loads(TIMINGS.read_text()) if TIMINGS.exists() else {}
    lane = sum(seconds.get(m, 1.0) for m in ONE_LANE)
    order = {}
    for item in items:
        order.setdefault(_unit(item.nodeid), len(order))
    # the units longest first (the lane's seconds are its modules'); stable: a module's own order kept
    items.sort(key=lambda it: (-(lane if _unit(it.nodeid) == "one lane" else seconds.get(_unit(it.nodeid), 1.0)),
                               order[_unit(it.nodeid)]))


_spent: dict = {}
_tests: dict = {}  # test -> its seconds (setup, call, teardown)
_busy: dict = {}  # module -> jiffies the machine's cores were busy while its tests ran (setup, call, teardown)


def _busy_jiffies() -> int:
    """All cores' busy time so far (/proc/stat's first line: everything but idle and iowait), in jiffies."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0
    return sum(fields) - fields[3] - fields[4]


def pytest_runtest_logreport(report):
    unit = report.nodeid.split("::", 1)[0]  # the module
    _spent[unit] = _spent.get(unit, 0.0) + report.duration
    _tests[report.nodeid] = _tests.get(report.nodeid, 0.0) + report.duration
    if report.when == "teardown" and _mark:
        now = _busy_jiffies()
        _busy[unit] = _busy.get(unit, 0) + now - _mark[0]
        _busy[report.nodeid] = now - _mark[0]
        _mark[0] = now


def pytest_collection_finish(session):
    """When to start the work the selected tests need that mostly waits on the network (tests/background.py)."""
    import json

    background.plan(session.items, json.loads(TIMINGS.read_text()) if TIMINGS.exists() else {})


_mark: list = []


def pytest_runtest_setup(item):
    if not _mark:
        _mark.append(_busy_jiffies())
    background.module_starts(item.nodeid)


_EXIT: dict = {}


def pytest_sessionfinish(session, exitstatus):
    """The background work stopped and its folders removed (tests/background.py). ``PROXRAY_TIMINGS_OUT=path``: each
    module's seconds (setup, calls and teardown) written there as JSON, the source of tests/timings.json (the
    controller sees every worker's reports)."""
    _EXIT["status"] = int(exitstatus)
    background.finish()
    import serve_helpers

    serve_helpers.release()
    import ray

    if ray.is_initialized():
        ray.shutdown()
    out = os.environ.get("PROXRAY_TIMINGS_OUT")
    if out and not os.environ.get("PYTEST_XDIST_WORKER") and _spent:
        import json

        Path(out).write_text(json.dumps({k: round(v, 1) for k, v in sorted(_spent.items())}, indent=1) + "\n")
        # how many cores each module kept busy on average (the whole machine's, background work included)
        hz = os.sysconf("SC_CLK_TCK")
        seconds = {**_spent, **{k: v for k, v in _tests.items() if v >= 10}}  # the modules and the tests of 10 s or more
        Path(out).with_suffix(".busy.json").write_text(json.dumps(
            {k: [round(v, 1), round(_busy.get(k, 0) / hz / v, 2)] for k, v in sorted(seconds.items()) if v}, indent=1)
            + "\n")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The suite's process ends here, with the session's exit status, once pytest has printed its summary: the
    interpreter's own finalization — torch's, ONNX Runtime's, faiss's and Ray's threads and libraries torn down at
    once after a 48-minute session — crashed once after every test had passed (a segmentation fault, exit 139), and
    nothing a test checks runs after this point. Ray was shut down above; a test worker of pytest-xdist exits as
    pytest has it."""
    if "status" in _EXIT and not os.environ.get("PYTEST_XDIST_WORKER"):
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT["status"])
