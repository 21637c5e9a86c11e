"""The suite's background work (tests/background.py) starts about its own duration before the first test that needs
it — not at the session's start, where it slowed the first modules as much as it saved — and its result is what the
same command gives when run in the foreground."""
import os
from pathlib import Path
from types import SimpleNamespace

import background


def test_work_starts_its_own_duration_before_the_test_that_needs_it(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(background, "_works", {})
    monkeypatch.setattr(background, "_plan", {})
    started = []
    monkeypatch.setattr(background, "_start", started.append)
    items = [SimpleNamespace(nodeid=f"tests/test_{m}.py::test_{i}") for m in "abcde" for i in range(2)]
    seconds = {"tests/test_a.py": 50, "tests/test_b.py": 100, "tests/test_c.py": 90, "tests/test_d.py": 5}
    background.declare("long", ["tests/test_e.py::test_1"], None, seconds=90)  # e starts at 245, c at 150, d at 240
    background.declare("now", ["tests/test_b.py::test_"], None, seconds=0)
    background.declare("first", ["tests/test_b.py::test_0"], None, seconds=500)  # more than the time before it
    background.declare("unused", ["tests/test_z.py"], None, seconds=10)
    background.plan(items, seconds)
    assert background._plan == {"tests/test_c.py": ["long"], "tests/test_b.py": ["now"], "tests/test_a.py": ["first"]}
    for item in items:
        background.module_starts(item.nodeid)
    assert started == ["first", "now", "long"]  # each once, in the order the modules run


def test_a_result_is_the_commands_own_and_its_folder_is_removed_at_the_end(monkeypatch):
    monkeypatch.setattr(background, "_works", {})
    background.declare("echo", ["tests/x.py"], lambda folder: ([["bash", "-c", "echo made > made; echo out; echo err >&2"],
                                                              ["bash", "-c", "exit 3"]], None, folder), seconds=0)
    done = background.result("echo")  # never planned: started on first use
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert (done.folder / "made").read_text() == "made\n"
    background.finish()
    assert not done.folder.exists()


def test_work_named_to_start_with_a_module_starts_there_where_that_module_comes_before_its_test(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(background, "_works", {})
    monkeypatch.setattr(background, "_plan", {})
    items = [SimpleNamespace(nodeid=f"tests/test_{m}.py::test_{i}") for m in "abcd" for i in range(2)]
    seconds = {"tests/test_a.py": 50, "tests/test_b.py": 100, "tests/test_c.py": 90, "tests/test_d.py": 5}
    background.declare("beside-b", ["tests/test_d.py::test_0"], None, seconds=10, start_with="tests/test_b.py")
    background.declare("own", ["tests/test_c.py::test_1"], None, seconds=0, start_with="tests/test_c.py")
    background.declare("too-late", ["tests/test_b.py::test_0"], None, seconds=0, start_with="tests/test_c.py")
    background.declare("not-selected", ["tests/test_a.py::test_0"], None, seconds=0, start_with="tests/test_z.py")
    background.plan(items, seconds)
    assert background._plan == {"tests/test_b.py": ["beside-b", "too-late"], "tests/test_c.py": ["own"],
                                "tests/test_a.py": ["not-selected"]}


def test_work_with_a_ray_of_its_own_gets_folders_and_ports_of_its_own(monkeypatch):
    monkeypatch.setattr(background, "_isolated", [])
    monkeypatch.setattr(background, "_works", {})  # finish() below ends these only
    one, two = background.isolated_env("one"), background.isolated_env("two")
    try:
        assert (one[background.MARK], two[background.MARK]) == ("one", "two")
        for name in ("RAY_TMPDIR", "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "RAY_SERVE_HAPROXY_SOCKET_PATH",
                     "RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"):
            assert one[name] != two[name] and one[name] != os.environ.get(name), name
        ranges = [range(int(e["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]), int(e["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]))
                  for e in (one, two, os.environ)]
        assert not set(ranges[0]) & set(ranges[1]) and not (set(ranges[0]) | set(ranges[1])) & set(ranges[2])
        assert len(one["RAY_SERVE_HAPROXY_SOCKET_PATH"]) < 40  # a Unix socket's path is bounded (108 bytes)
    finally:
        background.finish()
    assert not any(Path(e["RAY_TMPDIR"]).exists() for e in (one, two))


def test_a_quiet_module_starts_no_work_and_waits_for_those_running(monkeypatch, tmp_path):
    """A work planned with a module of ``QUIET`` starts with the next module instead; a ``QUIET`` module's first test
    waits until every work started before it has ended."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(background, "_works", {})
    monkeypatch.setattr(background, "_plan", {})
    monkeypatch.setattr(background, "_quieted", set())
    monkeypatch.setattr(background, "QUIET", {"tests/test_b.py", "tests/test_c.py"})
    items = [SimpleNamespace(nodeid=f"tests/test_{m}.py::test_0") for m in "abcd"]
    flag = tmp_path / "go"
    background.declare("slow", ["tests/test_d.py::test_0"], lambda folder: (
        [["bash", "-c", f"while [ ! -e {flag} ]; do sleep 0.1; done; echo done"]], None, folder), seconds=0,
        start_with="tests/test_a.py")
    background.declare("deferred", ["tests/test_d.py::test_0"], lambda folder: ([["true"]], None, folder), seconds=0,
                       start_with="tests/test_b.py")
    background.plan(items, {})
    assert background._plan == {"tests/test_a.py": ["slow"], "tests/test_d.py": ["deferred"]}
    background.module_starts(items[0].nodeid)
    import threading

    threading.Timer(0.5, flag.touch).start()  # the work ends half a second later
    background.module_starts(items[1].nodeid)  # waits for it
    assert background._works["slow"].proc.poll() == 0 and background._works["deferred"].proc is None
    background.finish()
