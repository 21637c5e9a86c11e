import json

import numpy as np
import pandas as pd
import pytest

from proxray import KMeansRouter, KNNRouter, RoutingTable
from proxray.routing.artifact import current_version
from proxray.cli import main


def test_import_routerdc_and_info(tmp_path, shared_data, capsys):
    files = [str(p) for p in sorted((shared_data / "raw" / "routerdc7").glob("humaneval*.json"))]
    out = tmp_path / "he.parquet"
    assert main(["import", "routerdc", *files, "--out", str(out)]) == 0
    t = RoutingTable.read(out)
    assert t.n_queries == 164 and len(t.models) == 7 and set(t.splits) == {"train", "test"}
    assert main(["info", str(out)]) == 0
    assert "accuracy_%" in capsys.readouterr().out


def test_import_error_is_reported_not_raised(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"query_id": ["a"], "task": ["t"], "prompt": ["p"], "model": ["m"], "correct": [3.0]}).to_csv(bad, index=False)
    assert main(["info", str(bad)]) == 2
    assert "column 'correct': outside [0, 1] at row 0 (3.0)" in capsys.readouterr().err


@pytest.mark.slow
def test_fit_writes_a_loadable_artifact(tmp_path, shared_data, capsys):
    from proxray.routing.temperature import PlugIn, Spread

    t = RoutingTable.read(shared_data / "routerbench_slice.parquet")
    small = t.subset(t.query_ids[::40])
    small.write(tmp_path / "small.parquet")
    assert main(["fit", "--table", str(tmp_path / "small.parquet"), "--router", "knn", "--k", "10",
                 "--out", str(tmp_path / "art")]) == 0
    r = KNNRouter.load(tmp_path / "art", encoder_id="sentence-transformers/all-MiniLM-L6-v2")
    assert r.n_train_ == small.n_queries and r.models_ == small.models
    manifest = json.loads((current_version(tmp_path / "art") / "manifest.json").read_text())
    assert manifest["dim"] == 384 and manifest["params"]["k"] == 10
    assert np.isfinite(r.estimate(np.ones((1, 384), np.float32))[0]).all()
    # --temperature auto is the default: kNN's is the spread temperature, KMeans' the plug-in temperature (no CV)
    assert r.temperature_ == Spread(0.2)
    assert main(["fit", "--table", str(tmp_path / "small.parquet"), "--router", "km", "--clusters", "4",
                 "--out", str(tmp_path / "km")]) == 0
    km = KMeansRouter.load(tmp_path / "km", encoder_id="sentence-transformers/all-MiniLM-L6-v2")
    assert km.temperature_ == PlugIn(0.125)
    # proxray explain: the evidence of a decision, named by the table's ids and tasks, as text and as JSON
    capsys.readouterr()
    text = small.prompts[3]
    assert main(["explain", text, "--router", str(tmp_path / "art"), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("routed to ") and "the 3 neighbours with the most weight of 10" in out
    assert small.query_ids[3] in out  # the text is a training query: its own row weighs most
    assert main(["explain", text, "--router", str(tmp_path / "km"), "--json", "--lam", "100"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["kind"] == "clusters" and ev["lam"] == 100 and ev["shown"] == 4 and ev["outlier"] is False
    assert set(ev["elements"][0]["tasks"]) <= set(small.tasks)
    assert main(["fit", "--table", str(tmp_path / "small.parquet"), "--router", "knn", "--temperature",
                 "plug-in:0.125", "--out", str(tmp_path / "bad")]) == 2  # KMeans only, refused before fitting
    assert not (tmp_path / "bad").exists()
    assert main(["fit", "--table", str(tmp_path / "small.parquet"), "--router", "knn", "--k", "10",
                 "--temperature", "spread:5", "--out", str(tmp_path / "spread")]) == 0
    assert KNNRouter.load(tmp_path / "spread").temperature_ == Spread(5.0)
    # the deprecated spelling still works and says what to write instead
    assert main(["fit", "--table", str(tmp_path / "small.parquet"), "--router", "knn", "--k", "10",
                 "--inv-tau", "5", "--temperature", "spread",
                 "--out", str(tmp_path / "old")]) == 0
    assert KNNRouter.load(tmp_path / "old").temperature_ == Spread(5.0)
    assert "--inv-tau 5 --temperature spread is deprecated: say --temperature spread:5" in capsys.readouterr().err
    # k larger than the table: an error naming both, before anything is encoded or written
    assert main(["fit", "--table", str(tmp_path / "small.parquet"), "--router", "knn",
                 "--out", str(tmp_path / "too-many")]) == 2
    err = capsys.readouterr().err
    assert "--k 100: must be an integer from 1 to the training queries' number (80); pass --k 80" in err
    assert not (tmp_path / "too-many").exists()


@pytest.mark.slow
def test_python_the_registry_and_proxray_fit_build_the_same_router(tmp_path, shared_data, encoder):
    """One temperature default: KNNRouter() / KMeansRouter() with their defaults, the registry's make_router and
    `proxray fit` with its defaults give the same router on a table, and the artifact the app loads estimates
    exactly what the Python router does (test_serve holds the app's answers to the artifact's estimates)."""
    from proxray.routing.registry import load_router, make_router

    t = RoutingTable.read(shared_data / "routerbench_slice.parquet")
    small = t.subset(t.query_ids[::20])  # 159 queries: more than kNN's default k
    small.write(tmp_path / "small.parquet")
    X = encoder.encode(small.prompts)
    acc, cost = small.matrices()
    queries = encoder.encode(["What is 17 times 23?", "Which gas do plants take in from the air?"])
    for kind, cls, flag in (("knn", KNNRouter, []), ("km", KMeansRouter, ["--clusters", "32"])):
        python = cls().fit(X, acc, cost, models=small.models, encoder_id=encoder.id)
        registry = make_router(kind).fit(X, acc, cost, models=small.models, encoder_id=encoder.id)
        assert main(["fit", "--table", str(tmp_path / "small.parquet"), "--router", kind, *flag,
                     "--out", str(tmp_path / kind)]) == 0
        served = load_router(tmp_path / kind, encoder_id=encoder.id)  # what the app loads
        assert python.get_params() == registry.get_params()  # the defaults, stated once
        assert served.get_params() == python.get_params()  # as passed, "auto" included
        assert python.temperature_.spec == served.temperature_.spec == {"knn": "spread:0.2", "km": "plug-in:0.125"}[kind]
        want = python.estimate(queries)
        for other in (registry, served):
            got = other.estimate(queries)
            np.testing.assert_allclose(got[0], want[0], atol=1e-5)
            np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-12)
        manifest = json.loads((current_version(tmp_path / kind) / "manifest.json").read_text())
        assert "inv_tau" not in manifest and manifest["params"]["temperature"] == "auto"  # as passed
        assert manifest["temperature"] == python.temperature_.spec  # and what it meant, which a load weighs with


def test_fit_refuses_a_bad_temperature_before_reading_the_table(tmp_path, capsys):
    assert main(["fit", "--temperature", "ess:3", "--out", str(tmp_path / "art")]) == 2
    assert "--temperature ess:3: temperature='ess:3': expected a number >= 0 or inf" in capsys.readouterr().err
    assert main(["fit", "--inv-tau", "0.5", "--temperature", "ess", "--out", str(tmp_path / "art")]) == 2
    assert "temperature 'ess' (the adaptive bandwidth of the τ study) is not part of proxray" in capsys.readouterr().err
    assert main(["fit", "--temperature", "-1", "--out", str(tmp_path / "art")]) == 2
    assert "temperature fixed:-1.0: must be a number >= 0 or inf" in capsys.readouterr().err
    assert not (tmp_path / "art").exists()


def test_one_grammar_and_the_old_spellings_still_parse(tmp_path, shared_data, capsys):
    """Inputs are --table / --config, outputs --out, everywhere; the old spellings mean the same and say so."""
    from proxray.cli import build_parser

    table = str(shared_data / "routerbench_slice.parquet")
    assert main(["info", "--table", table]) == 0
    new = capsys.readouterr()
    assert main(["info", table]) == 0
    old = capsys.readouterr()
    assert old.out == new.out and "a positional table is deprecated; use --table " + table in old.err
    assert main(["info"]) == 2  # a table or a router artifact
    assert "proxray info needs --table TABLE (a routing table) or --router ROUTER" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["info", "--table", table, str(tmp_path / "other.parquet")])
    assert "give one (--table)" in capsys.readouterr().err
    p = build_parser()
    assert p.parse_args(["build-table", "--config", "c.yaml", "--output", "x"]).out == "x"
    assert "--output is deprecated; use --out" in capsys.readouterr().err
    assert p.parse_args(["serve", "c.yaml"]).old_config == "c.yaml"
    assert p.parse_args(["fit", "--out", "r"]).router == p.parse_args(["eval"]).router == "km"
    assert main(["make-tiny-model", "--out", str(tmp_path / "tiny")]) == 0
    assert (tmp_path / "tiny" / "config.json").exists()
    # --help names every command, in plain text
    help_text = p.format_help()
    for cmd in ("import", "info", "fit", "explain", "eval", "build-table", "make-tiny-model", "serve", "monitor",
                "demo"):
        assert f"    {cmd}" in help_text


def test_commands_that_fit_nothing_start_without_the_routers_libraries(tmp_path):
    """A command that neither fits nor measures routers (`proxray keys new`, `proxray monitor --help`) imports none of
    scikit-learn, SciPy or pandas — the router registry's and the tables' libraries, ~1.5 s of every command's start
    — as the installed command runs it; `proxray --help` lists every command as the whole parser does, and `proxray fit
    --help` still lists the registry's families and their options."""
    import subprocess
    import sys

    from proxray.cli import build_parser, command_of

    heavy = ("sklearn", "scipy", "pandas", "torch", "proxray.routing.registry")
    probe = ("import sys\nfrom proxray.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             f"print('IMPORTED', sorted(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)")

    def imported(*argv):
        r = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120,
                           cwd=tmp_path)
        return r.stdout, r.stderr.rsplit("IMPORTED ", 1)[1].strip()

    out, mods = imported("keys", "new", "--file", str(tmp_path / "keys.yaml"), "--name", "ops")
    assert mods == "[]" and (tmp_path / "keys.yaml").exists() and out.startswith("sk-"), mods
    out, mods = imported("monitor", "--help")
    assert mods == "[]" and "status" in out, mods
    out, mods = imported("--help")
    assert mods == "[]", mods
    assert out == build_parser().format_help()  # the whole parser's, every command listed
    out, mods = imported("fit", "--help")
    assert "sklearn" in mods and "{km,knn}" in out and "--clusters" in out
    assert command_of(["--help"]) == "" and command_of(["monitor", "status"]) == "monitor"


def test_monitor_status_prints_json_only_while_ray_prints_to_drivers(monkeypatch, capsys):
    """What Ray pushes to every driver's stdout (the raylet's warnings, through Ray's own printer) goes to stderr while
    `proxray monitor status` runs: its stdout stays one JSON document a script parses."""
    import ray
    import sys

    from ray._private.worker import print_to_stdstream, print_worker_logs, stdout_deduplicator

    import proxray.monitor.actor as monitor

    class Status:
        def remote(self):
            print_to_stdstream({"lines": ["WARNING: 8 PYTHON worker processes have been started"], "pid": "raylet",
                                "is_err": False}, ignore_prefix=False)
            return {"drifted": 3, "jobs": []}

    class Actor:
        status = Status()

    monkeypatch.setattr(ray, "init", lambda **kw: None)
    monkeypatch.setattr(ray, "get", lambda ref, **kw: ref)

    def shutdown():  # Ray's disconnect prints what its deduplicator held back (a repeated warning) to sys.stdout
        print_to_stdstream({"lines": ["WARNING: 10 PYTHON worker processes have been started"], "pid": "raylet",
                            "is_err": False}, ignore_prefix=False)
        for leftover in stdout_deduplicator.flush():
            print_worker_logs(leftover, sys.stdout, False)

    monkeypatch.setattr(ray, "shutdown", shutdown)
    monkeypatch.setattr(monitor, "get_monitor", lambda name: Actor())
    assert main(["monitor", "status"]) in (0, None)
    out, err = capsys.readouterr()
    assert json.loads(out) == {"drifted": 3, "jobs": []}
    assert "8 PYTHON worker processes" in err and "10 PYTHON worker processes" in err


def test_monitor_versions_and_rollback_ask_the_running_monitor(monkeypatch, capsys):
    """`proxray monitor versions` prints the monitor's versions; `rollback --to N` asks it to serve N and prints what
    moved; a rollback it refuses exits with its reason."""
    import ray

    import proxray.monitor.actor as monitor
    from proxray.cli import main

    asked = []

    class Method:
        def __init__(self, name):
            self.name = name

        def remote(self, *args):
            asked.append((self.name, args))
            if self.name == "rollback" and args == (7,):  # as Ray raises a method's own failure
                raise ray.exceptions.RayTaskError("rollback", "", ValueError(
                    "--to 7: not a version other than the served one (1); versions: [0, 1]"))
            return {"versions": [{"version": 0, "status": "served"}], "rollback": {"from": 1, "to": 0}}[self.name]

    class Actor:
        versions, rollback = Method("versions"), Method("rollback")

    monkeypatch.setattr(ray, "init", lambda **kw: None)
    monkeypatch.setattr(ray, "get", lambda ref, **kw: ref)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(monitor, "get_monitor", lambda name: Actor())
    assert main(["monitor", "versions"]) in (0, None)
    assert json.loads(capsys.readouterr().out) == [{"version": 0, "status": "served"}]
    assert main(["monitor", "rollback", "--to", "0"]) in (0, None)
    assert json.loads(capsys.readouterr().out) == {"from": 1, "to": 0} and asked[-1] == ("rollback", (0,))
    with pytest.raises(SystemExit, match="monitor 'proxray-monitor': --to 7: not a version"):
        main(["monitor", "rollback", "--to", "7"])


def test_demo_serve_names_a_missing_config_and_prints_the_routers_reasons(tmp_path, monkeypatch, capsys):
    """`proxray demo serve` stops before anything starts on a config that is not there, naming it; what it prints of
    an answer names the model that answered and marks it among the router's estimates (the whole run: the README's
    first command, tests/test_user_paths.py)."""
    from proxray.demos.serve import base_url, describe

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["demo", "serve", "--config", "nope.yaml"])
    assert "--config nope.yaml: no such file" in str(e.value)
    assert base_url({"http_options": {"host": "0.0.0.0", "port": 8123}}) == "http://127.0.0.1:8123"
    report = {"lam": 0.0, "outlier_score": 0.25, "estimates": {"big": {"accuracy": 0.9, "cost": 3e-5},
                                                               "small": {"accuracy": 0.2, "cost": 2e-6}}}
    text = describe({"question": "2 + 2?", "model": "big", "answer": " Four. ", "report": report})
    assert text.splitlines()[1:3] == ["answered by: big", "answer:      Four."]
    assert [ln.split()[:2] for ln in text.splitlines()[4:]] == [["→", "big"], ["small", "0.200"]]
