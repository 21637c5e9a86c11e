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

    code = ("import sys, proxray, proxray.routing.knn, proxray.routing.kmeans, proxray.data.table, proxray.experiments.metrics, proxray.cli; "
            "print(sorted(m for m in ('torch', 'sentence_transformers', 'ray', 'vllm', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def _anchors(text):
    """GitHub's anchors of a Markdown text: its headings' slugs (lower case, punctuation but - and _ dropped, spaces to
    -, repeats numbered) and its explicit ``<a id="…">``."""
    found, seen = set(re.findall(r'<a id="([^"]+)"></a>', text)), {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_the_docs_links_resolve():
    """Every relative link of README.md, docs/ and research/ pages names a file of the repository and, with a
    #fragment, a heading or anchor of that file (the pages cross-link a lot; a renamed heading must not leave a dead
    link)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "research").rglob("*.md"))]
    dead, checked, anchors = [], 0, {}  # anchors: per linked .md file, read once
    for page in pages:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not ours to check offline
                continue
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            checked += 1
            if not file.exists():
                dead.append(f"{page.name}: {target} (no such file)")
                continue
            if fragment and file.suffix == ".md":
                if file not in anchors:
                    anchors[file] = _anchors(file.read_text())
                if fragment not in anchors[file]:
                    dead.append(f"{page.name}: {target} (no such heading or anchor)")
    assert checked > 80
    assert not dead, "dead links:\n" + "\n".join(dead)
