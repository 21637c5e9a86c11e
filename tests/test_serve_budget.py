"""The served app routing to a budget, over HTTP on 127.0.0.1 with the openai client: λ moves online so
that the recent mean estimated cost meets budget.cost_per_query. Marked slow (Serve start-up); bounded:
160 sequential requests."""
import numpy as np
import pytest

from serve_helpers import STRONG, WEAK, start_app, stop_app

pytestmark = pytest.mark.slow
TARGET = 1e-5  # between WEAK's 1e-6 and STRONG's 3e-5 per query


@pytest.fixture(scope="module")
def client(tmp_path_factory, encoder):
    from openai import OpenAI

    fixed = {"min_replicas": 1, "max_replicas": 1}
    models = [{"id": WEAK, "engine": "sim", "autoscaling": fixed}, {"id": STRONG, "engine": "sim", "autoscaling": fixed}]
    url = start_app(tmp_path_factory.mktemp("budget"), encoder, models,
                    budget={"cost_per_query": TARGET, "window": 20, "gain": 0.2})
    yield OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    stop_app()


def test_lambda_follows_the_budget_and_the_response_shows_it(client):
    from proxray.data.synthetic import generate_queries

    prompts = list(generate_queries(20, seed=9).prompt)[:160]
    reports = []
    for p in prompts:
        r = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": p}], max_tokens=8)
        reports.append(r.model_extra["proxray"])
    lams = [rep["lam"] for rep in reports]
    assert lams[0] == pytest.approx(0.1 / TARGET) and len(set(lams)) > 10  # λ moved with the traffic
    assert [rep["budget"]["requests"] for rep in reports] == list(range(1, len(prompts) + 1))
    assert all(rep["budget"]["cost_per_query"] == TARGET for rep in reports)
    spent = [rep["estimates"][rep_model]["cost"] for rep, rep_model in
             ((rep, next(iter(rep["estimates"]))) for rep in reports)]  # the first candidate is the routed one
    late = np.mean(spent[-80:])
    assert abs(late - TARGET) <= 0.25 * TARGET, late
    assert 0.05 < np.mean([s > TARGET for s in spent[-80:]]) < 0.95  # a mix of the two models, not one
    # a request with its own λ uses it and is not counted
    r = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": prompts[0]}],
                                       max_tokens=8, extra_body={"proxray": {"lam": 0.0}})
    assert r.model_extra["proxray"]["lam"] == 0.0 and "budget" not in r.model_extra["proxray"]
