import re

from conftest import ROOT


def fenced_blocks(text):
    return [b.strip() for b in re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S)]


def test_ci_runs_the_readme_test_command():
    blocks = fenced_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 2
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith(("#", "set ", "cd "))]
    assert ci == [blocks[1]], "the second fenced block of README.md must be the command .ci/run runs"
    assert "pytest" in blocks[1] and "proxray eval" in blocks[0]


def test_import_is_light():
    import subprocess
    import sys

    code = ("import sys, proxray, proxray.routers, proxray.table, proxray.metrics, proxray.cli; "
            "print(sorted(m for m in ('torch', 'sentence_transformers', 'ray', 'vllm', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
