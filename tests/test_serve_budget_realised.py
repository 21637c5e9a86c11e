"""The served app routing to a budget on *realised* cost, over HTTP on 127.0.0.1 with the openai client: λ
moves so that the recent mean of the answers' real cost (usage tokens at the configured prices) meets
budget.cost_per_query, where the router's estimates are a third of it. Marked slow (Serve start-up);
bounded: 160 sequential requests and three streams, metered whether or not the client asked for usage."""
import numpy as np
import pytest

from serve_helpers import STRONG, WEAK, start_app, stop_app

pytestmark = pytest.mark.slow
TARGET = 2e-5  # USD realised; the router estimates WEAK at 1e-6 and STRONG at 3e-5 per query
# USD per million tokens: an answer costs about three times what the router estimates
PRICES = {WEAK: {"input_per_mtok": 0.01, "output_per_mtok": 0.25}, STRONG: {"input_per_mtok": 0.3, "output_per_mtok": 7.5}}


def real_cost(model: str, usage) -> float:
    p = PRICES[model]
    return (usage.prompt_tokens * p["input_per_mtok"] + usage.completion_tokens * p["output_per_mtok"]) / 1e6


@pytest.fixture(scope="module")
def client(tmp_path_factory, encoder):
    from openai import OpenAI

    fixed = {"min_replicas": 1, "max_replicas": 1}
    models = [{"id": m, "engine": "sim", "autoscaling": fixed, "price": PRICES[m]} for m in (WEAK, STRONG)]
    url = start_app(tmp_path_factory.mktemp("budget_realised"), encoder, models,
                    budget={"cost_per_query": TARGET, "basis": "realised", "window": 20, "gain": 0.2})
    yield OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    stop_app()


def test_lambda_follows_the_realised_cost_and_every_stream_is_metered(client):
    from proxray.data.synthetic import generate_queries

    prompts = list(generate_queries(20, seed=9).prompt)[:160]
    reports, real, estimated = [], [], []
    for p in prompts:
        r = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": p}], max_tokens=8)
        rep = r.model_extra["proxray"]
        reports.append(rep)
        real.append(real_cost(r.model, r.usage))
        estimated.append(rep["estimated_cost"])
    assert all(rep["budget"]["basis"] == "realised" and rep["budget"]["unmetered"] == 0 for rep in reports)
    # a realised cost is counted when its answer is complete: the next request's report shows it
    assert [rep["budget"]["requests"] for rep in reports] == list(range(len(prompts)))
    assert len({rep["lam"] for rep in reports}) > 10
    late_real, late_estimated = np.mean(real[-80:]), np.mean(estimated[-80:])
    assert abs(late_real - TARGET) <= 0.25 * TARGET, (late_real, late_estimated)
    assert late_estimated < 0.6 * TARGET, (late_real, late_estimated)  # the estimates are not what is held
    assert 0.05 < np.mean([m == STRONG for m in (rep["model"] for rep in reports[-80:])]) < 0.95

    def stream(**kw):
        chunks = list(client.chat.completions.create(model="proxray", stream=True, max_tokens=8,
                                                     messages=[{"role": "user", "content": prompts[0]}], **kw))
        return chunks[0].model_extra["proxray"]["budget"], chunks

    # the gateway asks every model for a stream's usage: metered whether or not the client asked for it, and a
    # client that did not ask gets no usage
    before, plain = stream()
    assert all(c.usage is None and c.choices for c in plain)
    after, chunks = stream(stream_options={"include_usage": True})  # usage in its last chunk, as asked
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    last, _ = stream()
    assert (before["requests"], before["unmetered"]) == (160, 0)
    assert (after["requests"], after["unmetered"]) == (161, 0)
    assert (last["requests"], last["unmetered"]) == (162, 0)
