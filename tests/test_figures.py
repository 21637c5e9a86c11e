"""One value per measured figure: research/figures.yaml names each figure the README and the docs quote, the command
that measured it, the file that records it, the front and the machine; every page that quotes it quotes that value."""
import re
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

FIGURES = yaml.safe_load((ROOT / "research" / "figures.yaml").read_text())
FRONTS = {"HAProxy", "Python proxy", "none"}
FIELDS = ("id", "value", "what", "command", "file", "front", "machine", "quoted")


def pages() -> list[Path]:
    """The pages a user reads: the README, docs/ and research/'s pages."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "research").rglob("*.md"))]


def passages(text: str) -> list[str]:
    """A page's paragraphs, each on one line (a figure's words may be wrapped), and its table rows one by one."""
    out, para = [], []
    for line in text.splitlines() + [""]:
        if line.lstrip().startswith("|"):
            out.append(line)
        elif line.strip():
            para.append(line.strip())
            continue
        if para:
            out.append(" ".join(para))
            para = []
    return out


def quotes(figure: dict, texts: dict[str, str]) -> list[tuple[str, str]]:
    """(page, value as written) for every place ``texts`` quote ``figure``."""
    found = []
    for page, text in texts.items():
        for passage in passages(text):
            for pattern in figure["quoted"]:
                found += [(page, m.group(1).strip("*").rstrip(",;:)")) for m in re.finditer(pattern, passage)]
    return found


def numbers(value: str) -> list[str]:
    return re.findall(r"\d[\d,]*(?:\.\d+)?", value)


@pytest.fixture(scope="module")
def texts():
    return {str(p.relative_to(ROOT)): p.read_text() for p in pages()}


def test_every_figure_names_its_command_file_front_and_machine():
    assert len({f["id"] for f in FIGURES}) == len(FIGURES)
    for f in FIGURES:
        assert all(f.get(k) for k in FIELDS), (f.get("id"), [k for k in FIELDS if not f.get(k)])
        assert f["front"] in FRONTS, (f["id"], f["front"], sorted(FRONTS))
        script = re.search(r"(?:python (?:-m )?|bash )(\S+)", f["command"])
        if script and ("/" in script.group(1) or script.group(1).startswith(("proxray.", "research."))):
            path = script.group(1)  # a script of the repository, or a module of it
            assert (ROOT / path).exists() or (ROOT / (path.replace(".", "/") + ".py")).exists(), (f["id"], path)
        recorded = (ROOT / f["file"]).read_text()
        missing = [n for n in numbers(f["value"]) if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", recorded)]
        assert not missing, f"{f['id']}: {f['file']} does not hold {missing} of {f['value']}"


@pytest.mark.parametrize("figure", FIGURES, ids=[f["id"] for f in FIGURES])
def test_every_page_quotes_the_one_value(figure, texts):
    found = quotes(figure, texts)
    others = sorted({(page, v) for page, v in found if v != figure["value"]})
    assert not others, f"{figure['id']} is {figure['value']!r} ({figure['file']}), quoted otherwise: {others}"
    assert any(page != figure["file"] for page, _ in found), f"{figure['id']}: quoted nowhere but its own file"


def test_a_second_value_for_a_figure_is_found():
    """The check itself: a page quoting another value for a figure, or the same wrapped across lines, is found."""
    figure = next(f for f in FIGURES if f["id"] == "static-encoder-one-text")
    texts = {"a.md": "It encodes a text in\n0.1 ms on one core.\n", "b.md": f"One text encodes in {figure['value']}.\n"}
    assert quotes(figure, texts) == [("a.md", "0.1 ms"), ("b.md", figure["value"])]
