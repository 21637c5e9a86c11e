"""The reference pages against what runs: the HTTP page's routes are the app's, every status the code answers with is
on it, every report field an answer carries is on it; the metrics page's series are what a Prometheus scrape of a
running CPU demo shows (its simulated models, its model aliases, a keys file and an external endpoint on 127.0.0.1),
name for name."""
import re
import sys
import time
from types import SimpleNamespace

import httpx
import pytest
import yaml

from conftest import ROOT

sys.path.insert(0, str(ROOT / "docs"))
import generate  # noqa: E402  (docs/generate.py: the pages' generator)


def test_the_http_page_lists_the_routes_the_app_serves():
    from proxray.serve.protocols import PROTOCOLS
    from proxray.serve.request.http import gateway_api

    async def handler():
        return {}

    gateway = SimpleNamespace(args=SimpleNamespace(docs=False, cors_origins=None), protocols=PROTOCOLS,
                              feedback=handler, health=handler, store=None, gate=None, metrics=None, cache=None,
                              listing=SimpleNamespace(list=handler, get=handler))
    app = gateway_api(gateway, lambda protocol: handler)
    served = {(m, r.path) for r in app.routes for m in getattr(r, "methods", ()) if m != "HEAD"}
    listed = {(m, p) for m, p, *_ in generate.http_routes()}
    assert served == listed
    page = (ROOT / "docs/reference/http.md").read_text()
    for method, path in listed:
        assert f"\n## {method} {path}\n" in page and f"{generate.BASE}{path.split('{')[0]}" in page


def test_every_status_the_gateway_answers_is_on_the_http_page():
    from proxray.serve.errors import STATUSES

    raised = set()
    for path in (ROOT / "proxray/serve").rglob("*.py"):
        text = path.read_text()
        raised |= {int(s) for s in re.findall(r"RequestError\(\s*(\d{3})", text)}
        raised |= {int(s) for s in re.findall(r"\berror\((\d{3}),", text)}
    assert raised and raised <= set(STATUSES), raised - set(STATUSES)
    assert all(set(codes) <= set(STATUSES) for _, codes in generate.ANSWERS.values())
    page = (ROOT / "docs/reference/http.md").read_text()
    assert all(f"\n| {s} | " in page for s in STATUSES)


def test_the_monitor_text_is_on_the_metrics_page():
    from proxray.common.metric_defs import MONITOR_TEXT
    from proxray.monitor.views import prometheus_text

    status = {"reported": 3, "drifted": 1, "outlier_rate": 0.3, "drift_queue": 1, "shadow_labelled": 0,
              "evaluations": 1, "spent_usd": 0.5, "router_version": 2, "served_version": 2, "overlap_threshold": 0.4,
              "feedback": {"received": 1, "absorbed": 1, "merged": 0, "pending": 0},
              "gate": {"candidate": {"version": 3}, "decisions": {"promoted": 1},
                       "last_decision": {"version": 2, "decision": "promoted"}},
              "label_sources": {"judge": {"agreement": 0.9, "checked": 10, "set_aside": False}},
              "overlap": {"outlier": {"j": 0.2}}, "groups": {"g1": {"j": 0.5}}}
    names = {ln.split("{")[0].split()[0] for ln in prometheus_text(status).splitlines()}
    assert names == set(MONITOR_TEXT)
    page = (ROOT / "docs/reference/metrics.md").read_text()
    assert all(f"| `{n}` |" in page for n in MONITOR_TEXT)


# ---- a running CPU demo, scraped -------------------------------------------------------------------------------
KEYS: dict = {}
EXTERNAL = "gpt-standin"


@pytest.fixture(scope="module")
def demo(tmp_path_factory, encoder):
    from openai_standin import MODEL, StandIn, key_file
    from proxray.serve.front import free_port
    from proxray.serve.tenancy.keys import new_key_entry
    from serve_helpers import start_app, stop_app

    tmp = tmp_path_factory.mktemp("reference")
    args = yaml.safe_load((ROOT / "serve_configs/cpu_demo.yaml").read_text())["applications"][0]["args"]
    upstream_key, upstream_file = key_file(tmp)
    standin = StandIn(upstream_key, faults=False)
    models = [{**m, "autoscaling": {"min_replicas": 1, "max_replicas": 1}} for m in args["models"]]
    models.append({"id": EXTERNAL, "engine": "openai", "source": MODEL, "base_url": standin.url,
                   "api_key_file": str(upstream_file)})
    f = tmp / "keys.yaml"
    KEYS["dev"] = new_key_entry(f, "dev", budget={"usd": 10.0})
    port = free_port()
    url = start_app(tmp, encoder, models, metrics_port=port, keys_file=str(f), timeout_s=30,
                    model_aliases=args["model_aliases"], profile={EXTERNAL: (0.2, 1e-3)})
    yield url, f"http://127.0.0.1:{port}/metrics"
    stop_app()
    standin.stop()


def post(url, path, body, **headers):
    return httpx.post(f"{url}{path}", json=body, headers={"Authorization": f"Bearer {KEYS['dev']}", **headers},
                      timeout=60)


@pytest.mark.slow
def test_answers_carry_only_documented_report_fields(demo):
    from proxray.serve.request.report import undocumented

    url, _ = demo
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    reports = []
    r = post(url, "/v1/chat/completions", {"model": "proxray", "messages": ask,
                                           "proxray": {"explain": True, "conversation": "c-1"}})
    assert r.status_code == 200, r.text
    reports.append(r.json()["proxray"])
    # the answer is remembered just after it is sent, and a busy answer book asks to be retried (503, retry-after):
    # wait for it as a client would, bounded
    deadline = time.monotonic() + 30
    while (fb := post(url, "/v1/feedback", {"id": r.json()["id"], "score": 1.0})).status_code in (404, 503) \
            and time.monotonic() < deadline:
        time.sleep(0.1 if fb.status_code == 404 else float(fb.headers.get("retry-after", 1)))
    assert fb.status_code == 200, fb.text
    r = post(url, "/v1/chat/completions", {"model": EXTERNAL, "messages": ask})
    assert r.status_code == 200, r.text
    reports.append(r.json()["proxray"])
    r = post(url, "/v1/messages", {"model": "claude-3-5-haiku-latest", "max_tokens": 16, "messages": ask,
                                   "thinking": {"type": "enabled", "budget_tokens": 1024}}, **{"x-api-key": KEYS["dev"]})
    assert r.status_code == 200, r.text
    reports.append(r.json()["proxray"])
    r = post(url, "/v1/responses", {"model": "proxray", "input": "And of Spain?", "store": True})
    assert r.status_code == 200, r.text
    reports.append(r.json()["proxray"])
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={"model": "proxray", "messages": ask, "stream": True},
                      headers={"Authorization": f"Bearer {KEYS['dev']}"}, timeout=60) as s:
        first = next(ln for ln in s.iter_lines() if ln.startswith("data: "))
    import json

    reports.append(json.loads(first[6:])["proxray"])
    assert post(url, "/v1/chat/completions", {"model": "no-such-model", "messages": ask}).status_code == 404
    assert [undocumented(rep) for rep in reports] == [[]] * len(reports)
    assert {"conversation", "evidence", "key", "dropped"} <= {k for rep in reports for k in rep}


@pytest.mark.slow
def test_a_scrape_of_the_demo_shows_what_the_metrics_page_lists(demo):
    """Every ``ray_proxray_*`` series the scrape shows is on the page under that name, and every series on the page
    whose event this test made (routed and named requests, an error, feedback, a key, an external endpoint) is seen."""
    from proxray.common.metric_defs import METRICS

    url, scrape = demo
    test_answers_carry_only_documented_report_fields(demo)  # the events (again: the counters only grow)
    made = {"", "a request of a `keys_file` key", "a request to an `engine: openai` model", "an error answer",
            "a feedback post", "a feedback post with a score above 0"}
    expected = {n for m in METRICS.values() if m.when in made for n in m.scraped()}
    deadline = time.monotonic() + 60  # Ray's metrics agent exports every few seconds: wait for the series, bounded
    while True:
        text = httpx.get(scrape, timeout=10).text
        seen = {ln.split("{")[0].split()[0] for ln in text.splitlines()
                if ln.startswith("ray_proxray_") and not ln.startswith("#")}
        if expected <= seen or time.monotonic() > deadline:
            break
        time.sleep(1)
    listed = {n for m in METRICS.values() for n in m.scraped()}
    assert seen - listed == set(), "series a scrape shows that the metrics page does not list"
    assert expected - seen == set(), "series the page lists that the scrape did not show"
    page = (ROOT / "docs/reference/metrics.md").read_text()
    assert all(f"`{m.scraped()[0]}`" in page for m in METRICS.values())


def test_metric_definitions_are_what_ray_takes():
    """Ray's metrics take ASCII names and descriptions (its Cython layer encodes them so)."""
    from proxray.common.metric_defs import METRICS

    assert all(m.help.isascii() and re.fullmatch(r"proxray_[a-z_]+", m.name) for m in METRICS.values())
