"""The documentation a user follows: generated reference pages up to date with the code, every `proxray` command
in the README and docs/ parsing with today's grammar (no deprecated spelling), every YAML model list valid, the
README a front page, and the docs speaking of the product only."""
import contextlib
import json
import io
import re
import runpy
import shlex

import pytest
import yaml

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMMANDS = {"import", "info", "fit", "eval", "serve", "monitor", "demo", "build-table", "make-tiny-model", "--help"}


def test_generated_reference_is_up_to_date():
    gen = runpy.run_path(str(ROOT / "docs" / "generate.py"))
    stale = [name for name, make in gen["PAGES"].items() if (ROOT / "docs" / "reference" / name).read_text() != make()]
    assert not stale, f"stale: {stale}; run python docs/generate.py"


def _blocks(text, languages=("bash", "sh", "")):
    """The fenced code blocks of a Markdown text in those languages, paired fence by fence."""
    blocks, current, lang = [], None, None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current, lang = [], line[3:].strip()
            else:
                if lang in languages:
                    blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _commands(text):
    """`proxray …` invocations in code blocks: continuations joined, comments and chains split off."""
    for block in _blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0]
            for part in re.split(r"&&|;|\|\|", line):
                part = part.strip()
                m = re.match(r"^(?:\S*/)?proxray (.*)$", part)
                if m and not re.search(r"[…|\[]|[A-Z]{4,}\b", m.group(1)):  # a synopsis with placeholders
                    if m.group(1).split()[0] in COMMANDS:  # not prose that starts with the name
                        yield part, m.group(1)


def test_every_documented_command_parses_in_todays_grammar():
    from proxray.cli import build_parser
    from proxray.common.cliargs import settle

    found, bad = 0, []
    for page in PAGES:
        for cmd, args in _commands(page.read_text()):
            found += 1
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    settle(build_parser().parse_args(shlex.split(args)))
            except SystemExit:
                bad.append(f"{page.relative_to(ROOT)}: {cmd}: {err.getvalue().strip().splitlines()[-1:]}")
                continue
            if "deprecated" in err.getvalue():
                bad.append(f"{page.relative_to(ROOT)}: {cmd}: {err.getvalue().strip()}")
    assert found > 25
    assert not bad, "\n".join(bad)


def test_documented_model_lists_are_valid_pool_models():
    from proxray.pool.spec import PoolModel

    checked = 0
    for page in PAGES:
        for block in _blocks(page.read_text(), ("yaml",)):
            doc = yaml.safe_load(block)
            for m in (doc or {}).get("models", []) if isinstance(doc, dict) else []:
                PoolModel.model_validate(m)
                checked += 1
    assert checked >= 2


def test_the_readme_is_a_front_page_and_the_docs_speak_of_the_product():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 260
    for heading in ("Install", "The main job", "Evaluate a pool on a cluster", "Serve a routed endpoint",
                    "Autoscale on routed load", "Documentation"):
        assert re.search(rf"^## {heading}", readme, flags=re.M), heading
    offenders = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if re.search(r"\bissue(s)?\b|\bthe team\b|\bthis session\b|\bthis task\b", line, flags=re.I):
                offenders.append(f"{page.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("platform", ["cpu", "vllm-cpu", "dev", "gpu"])
def test_install_script_names_every_platform_it_documents(platform):
    script = (ROOT / "install.sh").read_text()
    assert f"bash install.sh {platform}" in script or platform == "cpu"
    assert re.search(rf"^\s+{re.escape(platform)}\)", script, flags=re.M)


def test_install_script_refuses_an_unknown_platform_before_touching_anything(tmp_path):
    import shutil
    import subprocess

    shutil.copy(ROOT / "install.sh", tmp_path / "install.sh")
    r = subprocess.run(["bash", str(tmp_path / "install.sh"), "cuda"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown platform 'cuda' (cpu, vllm-cpu, dev or gpu)" in r.stderr
    assert not (tmp_path / ".venv").exists()


ENV_READ = re.compile(r"""(?:environ(?:\.get|\.setdefault|\.pop)?\s*[(\[]\s*|getenv\()["']([A-Z_][A-Z0-9_]+)["']""")


def test_every_environment_variable_the_code_reads_is_documented():
    """docs/reference/environment.md lists every variable the package, the job entry points, the benchmarks and the
    installer read — literal reads in the code, the serving front's own names, install.sh's ${...}."""
    from proxray.serve.front import FRONT, NODE_PORTS

    read = set(FRONT) | set(NODE_PORTS)
    for folder in ("proxray", "jobs", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(ENV_READ.findall(path.read_text()))
    read |= set(re.findall(r"\$\{([A-Z_][A-Z0-9_]+)", (ROOT / "install.sh").read_text()))
    page = (ROOT / "docs" / "reference" / "environment.md").read_text()
    assert len(read) >= 15
    assert sorted(v for v in read if f"`{v}`" not in page) == []


def test_the_python_api_pages_snippet_runs_and_every_method_the_guides_call_is_listed(tmp_path):
    """The Python API page's snippet, as the page shows it, from a table to a routed decision (the most accurate model
    at λ = 0, a cheaper one as λ grows); and every ``r.<method>(`` / ``RoutingTable.<method>(`` a guide's Python
    calls on a router or a table is on the page."""
    page = (ROOT / "docs" / "reference" / "python-api.md").read_text()
    out = _run_python(_blocks(page, ("python",))[0], tmp_path)
    chosen = [line.split(" ", 1)[1] for line in out.stdout.splitlines()]
    assert len(chosen) == 3 and chosen[0] != chosen[-1], out.stdout  # λ moves the decision to a cheaper model
    assert (tmp_path / "my-router").is_dir()
    called = set()
    for guide in PAGES:
        for block in _blocks(guide.read_text(), ("python",)):
            called |= set(re.findall(r"\b(?:r|r2|router|RoutingTable|table|KNNRouter|KMeansRouter)\.([a-z_]+)\(", block))
    missing = sorted(m for m in called if f"`{m}(" not in page and f"classmethod `{m}(" not in page)
    assert called and not missing, missing


def test_the_shipped_alerts_and_scrape_configuration_name_only_series_the_gateway_exports():
    """deploy/prometheus/alerts.yaml: every rule whole (alert, expr, severity, summary), every series it queries one
    the metrics reference lists; the PodMonitor selects the port KubeRay names ``metrics``; every node of the
    launcher's cluster exports on the port the operator's page scrapes."""
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yaml").read_text())
    reference = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    listed = set(re.findall(r"`(ray_proxray_[a-z_]+?)(?:_bucket)?`", reference))
    names = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["alert"].startswith("Proxray") and rule["labels"]["severity"] and rule["annotations"]["summary"]
            names.append(rule["alert"])
            series = set(re.findall(r"\b(ray_proxray_[a-z_]+)", rule["expr"]))
            unknown = {s for s in series if s not in listed and s.removesuffix("_bucket") not in listed}
            assert series and not unknown, (rule["alert"], unknown)
    page = (ROOT / "docs" / "operations" / "operate.md").read_text()
    assert [n for n in names if f"`{n}`" not in page] == []  # every alert explained on the operator's page
    monitor = yaml.safe_load((ROOT / "deploy" / "kuberay" / "podmonitor.yaml").read_text())
    assert monitor["kind"] == "PodMonitor" and monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"] == {"ray.io/is-ray-node": "yes"}
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    for commands in (cluster["head_start_ray_commands"], cluster["worker_start_ray_commands"]):
        assert "--metrics-export-port=8080" in next(c for c in commands if "ray start" in c)


def test_no_page_gets_wordier_and_a_new_page_averages_25_words_a_sentence_at_most():
    """docs/readability.py's report: each written page's average sentence length at or under its recorded ceiling
    (docs/readability.json: lowered with ``--write`` as pages are rewritten), a page with none at or under 25."""
    gen = runpy.run_path(str(ROOT / "docs" / "readability.py"))
    ceilings = json.loads((ROOT / "docs" / "readability.json").read_text())
    got = gen["report"]()
    assert len(got) >= 20 and all(avg > 0 for avg in got.values()), got
    wordier = {p: (avg, ceilings.get(p, gen["TARGET"])) for p, avg in got.items()
               if avg > ceilings.get(p, gen["TARGET"]) + 0.5}
    assert not wordier, f"average words a sentence over the page's ceiling: {wordier} (python docs/readability.py)"


RUNNABLE = [("docs/guides/fit-and-evaluate.md", "## Routers in Python")]  # guides' Python that says it runs as it is


@pytest.mark.parametrize("page,heading", RUNNABLE)
def test_a_guides_python_that_says_it_runs_runs_as_written(tmp_path, page, heading):
    text = (ROOT / page).read_text()
    _run_python(_blocks(text[text.index(heading):], ("python",))[0], tmp_path)


def _run_python(snippet: str, cwd):
    """A page's Python run as written, in a process of its own in ``cwd``: its completed process (exit 0 asserted)."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", snippet], cwd=cwd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TQDM_DISABLE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return out
