"""The protocol table is the one seam: a toy protocol (``toy_protocol``: a route, a request model and a translator,
written outside the package) added to the app's table alone gets routed, streamed, budgeted and reported answers over
HTTP on 127.0.0.1 — the shipped protocols' routes answering beside it. And the seam's shape: no request stage, model
deployment or the ingress names a protocol, and ``proxray.serve`` imports no room above its own."""
import ast
import json
import re
from pathlib import Path

import httpx
import pytest

from serve_helpers import STRONG, WEAK, ledger, start_app, stop_app

ROOT = Path(__file__).resolve().parents[1]
PRICES = {WEAK: {"input_per_mtok": 0.1, "output_per_mtok": 0.2}, STRONG: {"input_per_mtok": 3.0, "output_per_mtok": 15.0}}
KEYS: dict = {}


@pytest.fixture(scope="module")
def app(tmp_path_factory, encoder):
    from proxray.serve.tenancy.keys import new_key_entry

    import toy_protocol

    tmp = tmp_path_factory.mktemp("toy")
    KEYS["dev"] = new_key_entry(tmp / "keys.yaml", "dev", budget={"usd": 10.0})
    models = [{"id": m, "engine": "sim", "autoscaling": {"min_replicas": 1, "max_replicas": 1}, "price": PRICES[m]}
              for m in (WEAK, STRONG)]
    # the replicas import toy_protocol: the suite's Serve apps have the tests' folder on their workers' path
    yield start_app(tmp, encoder, models, keys_file=str(tmp / "keys.yaml"), protocols=toy_protocol.TABLE)
    stop_app()


def priced(model, used):
    p = PRICES[model]
    return (used["prompt_tokens"] * p["input_per_mtok"] + used["completion_tokens"] * p["output_per_mtok"]) / 1e6


@pytest.mark.slow
def test_a_protocol_added_to_the_table_is_routed_streamed_budgeted_and_reported(app):
    h = {"Authorization": f"Bearer {KEYS['dev']}"}
    ask = {"model": "proxray", "question": "What is the capital of France?", "max_tokens": 8}
    r = httpx.post(f"{app}/v1/ask", json=ask, headers=h, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    report = got["proxray"]
    assert got["answer"] and got["used"]["completion_tokens"] > 0 and got["model"] == report["model"]
    assert report["routed"] and report["model"] in (WEAK, STRONG) and "outlier_score" in report
    assert report["key"]["name"] == "dev" and r.headers["x-proxray-routed"] == "true"
    spent = ledger("dev")["spent_usd"]
    assert spent == pytest.approx(priced(got["model"], got["used"]), rel=1e-6)  # charged at its usage

    with httpx.stream("POST", f"{app}/v1/ask", json={**ask, "model": WEAK, "stream": True}, headers=h,
                      timeout=60) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        lines = [line[5:].strip() for line in s.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "[END]"
    events = [json.loads(x) for x in lines[:-1]]
    assert events[0]["type"] == "start" and events[0]["model"] == WEAK and events[0]["proxray"]["routed"] is False
    pieces = "".join(e["text"] for e in events if e["type"] == "piece")
    done = events[-1]
    assert pieces and done["type"] == "done" and done["used"]["completion_tokens"] > 0
    assert ledger("dev")["spent_usd"] - spent == pytest.approx(priced(WEAK, done["used"]), rel=1e-6)

    bad = httpx.post(f"{app}/v1/ask", json={**ask, "max_tokens": 8, "max_completion_tokens": 9}, headers=h, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_completion_tokens"  # the body's model
    chat = httpx.post(f"{app}/v1/chat/completions", headers=h, timeout=60,
                      json={"model": "proxray", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert chat.status_code == 200 and chat.json()["proxray"]["routed"]  # the shipped protocols beside it


def test_no_request_stage_deployment_or_the_ingress_names_a_protocol():
    """The protocols' names and paths appear in ``proxray/serve/protocols`` and the wire constants alone (a chat
    body's ``"messages"`` field, which the engines read, is not a protocol's name)."""
    names = re.compile(r"""["'](chat|completions|responses|count_tokens|anthropic)["']|(==|!=|in \(?)\s*["']messages"""
                       r"""["']|/v1/(chat|completions|responses|messages)""")
    places = [ROOT / "proxray/serve/ingress.py", ROOT / "proxray/serve/gateway.py",
              *(ROOT / "proxray/serve/stages").glob("*.py"), *(ROOT / "proxray/serve/request").glob("*.py"),
              *(ROOT / "proxray/serve/deployments").glob("*.py")]
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in places
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if names.search(line) and not line.lstrip().startswith("#")]
    assert found == []


def _imports(path: Path):
    """(module-level imports, function-level imports) of proxray.serve in ``path``, with their line."""
    tree = ast.parse(path.read_text())
    top, inner = [], []

    def visit(node, depth):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.ImportFrom) and (ch.module or "").startswith("proxray.serve"):
                (inner if depth else top).append((ch.module, ch.lineno, path.read_text().splitlines()[ch.lineno - 1]))
            visit(ch, depth + isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, 0)
    return top, inner


FLOORS = {"errors": 0, "config": 0, "wire": 0, "metrics": 0, "preflight": 0, "front": 0,
          "deployments": 1, "tenancy": 1, "request": 2, "protocols": 3,
          "monitor_client": 4, "gateway": 4, "stages": 4, "ingress": 5, "builder": 6, "app": 7}


def test_serve_imports_down_its_floors_and_defers_little():
    """Each room of proxray.serve imports only rooms on a lower floor or its own; at most 5 function-level imports of
    proxray.serve inside it, each saying what heavy import it defers."""
    def room(module: str) -> str:
        return module.split(".")[2]

    up, inner = [], []
    for path in (ROOT / "proxray/serve").rglob("*.py"):
        here = room(".".join(path.relative_to(ROOT).with_suffix("").parts))
        top, deferred = _imports(path)
        inner += [(path, line) for _, _, line in deferred]
        for module, lineno, _ in top + deferred:
            if module.count(".") >= 2 and FLOORS[room(module)] > FLOORS[here]:
                up.append(f"{path.relative_to(ROOT)}:{lineno} imports {module}")
    assert up == []
    assert len(inner) <= 5 and all("#" in line for _, line in inner), inner


def test_the_app_builder_a_serve_config_names_takes_its_args_alone():
    """Serve calls the builder of ``import_path`` with one dictionary: another protocol table, or router families, are
    ``build``'s."""
    import inspect

    from proxray.serve.app import build, build_app

    assert list(inspect.signature(build_app).parameters) == ["args"]
    assert list(inspect.signature(build).parameters) == ["args", "protocols", "families"]
