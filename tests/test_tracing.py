"""OpenTelemetry traces of a running app (127.0.0.1): the app's workers given ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a
receiver here, decoding OTLP/HTTP protobuf as a collector does); requests through httpx with and without the client's
W3C ``traceparent``; the relayed endpoint (an OpenAI stand-in) shown the model call's context. Bounded waits on the
receiver's spans, never on time."""
import secrets

import httpx
import pytest

from openai_standin import MODEL, StandIn, key_file
from otlp_receiver import Receiver
from proxray.common.tracing import enabled
from serve_helpers import BROKEN, STRONG, WEAK, start_app, stop_app

pytestmark = pytest.mark.slow
EXTERNAL = "frontier"
SERVER, CLIENT = 2, 3  # OTLP's SpanKind numbers


def test_tracing_is_off_unless_an_otlp_endpoint_is_named():
    assert not enabled({})
    assert enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert not enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"})
    assert not enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})


@pytest.fixture(scope="module")
def app(tmp_path_factory, encoder):
    tmp = tmp_path_factory.mktemp("tracing")
    key, path = key_file(tmp)
    standin, receiver = StandIn(key, faults=False), Receiver()
    one = {"min_replicas": 1, "max_replicas": 1}
    models = [{"id": WEAK, "engine": "sim", "autoscaling": one}, {"id": STRONG, "engine": "sim", "autoscaling": one},
              {"id": BROKEN, "engine": "sim", "engine_kwargs": {"fail_always": True}, "autoscaling": one},  # looks best
              {"id": EXTERNAL, "engine": "openai", "source": MODEL, "base_url": standin.url, "api_key_file": str(path),
               "price": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}]
    url = start_app(tmp, encoder, models, profile={BROKEN: (1.0, 1e-9), EXTERNAL: (0.97, 1e-7), STRONG: (0.5, 3e-5)},
                    timeout_s=30,
                    env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "gateway-under-test",
                         "OTEL_BSP_SCHEDULE_DELAY": "200"})
    yield url, standin, receiver
    stop_app()
    standin.stop()
    receiver.stop()


def traceparent():
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent, f"00-{trace_id}-{parent}-01"


def test_a_routed_request_continues_the_clients_trace_falls_back_and_passes_it_to_the_endpoint(app):
    url, standin, receiver = app
    trace_id, parent, header = traceparent()
    r = httpx.post(f"{url}/v1/chat/completions", headers={"traceparent": header}, timeout=60,
                   json={"model": "proxray", "max_tokens": 16, "messages": [{"role": "user", "content": "What is 2+2?"}]})
    assert r.status_code == 200 and r.json()["proxray"]["model"] == EXTERNAL, r.text[:300]
    spans = {s["name"]: s for s in receiver.trace(trace_id, 3)}
    server, route, call = spans["chat proxray"], spans["route"], spans[f"chat {EXTERNAL}"]
    assert server["kind"] == SERVER and server["parent_id"] == parent and server["service"] == "gateway-under-test"
    assert route["parent_id"] == call["parent_id"] == server["span_id"] and call["kind"] == CLIENT
    assert route["attributes"]["proxray.chosen_model"] == BROKEN and "proxray.router_path" in route["attributes"]
    assert call["attributes"]["proxray.fallback_from"] == [BROKEN]  # asked first, failed: the endpoint answered
    usage = r.json()["usage"]
    for s in (server, call):
        a = s["attributes"]
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.response.model"] == EXTERNAL
        assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"] > 0
        assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"] > 0
        assert a["proxray.cost_usd"] == pytest.approx((usage["prompt_tokens"] + 2 * usage["completion_tokens"]) / 1e6)
    assert server["attributes"]["gen_ai.request.model"] == "proxray" and server["attributes"]["gen_ai.request.max_tokens"] == 16
    assert server["start"] <= route["start"] <= route["end"] <= call["start"] <= call["end"] <= server["end"]
    sent = [h for h, _ in standin.requests if h.get("traceparent", "").split("-")[1:2] == [trace_id]]
    assert sent and sent[-1]["traceparent"].split("-")[2] == call["span_id"]  # the model call's context, not the client's


def test_a_stream_ends_its_spans_with_its_usage_and_a_request_without_traceparent_starts_a_trace(app):
    url, standin, receiver = app
    trace_id, _, header = traceparent()
    with httpx.stream("POST", f"{url}/v1/chat/completions", headers={"traceparent": header}, timeout=60,
                      json={"model": WEAK, "stream": True, "max_completion_tokens": 8,
                            "messages": [{"role": "user", "content": "Say hi"}]}) as r:
        assert r.status_code == 200 and "[DONE]" in "".join(r.iter_text())
    spans = receiver.trace(trace_id, 2)
    assert sorted(s["name"] for s in spans) == [f"chat {WEAK}", f"chat {WEAK}"]  # named: no route span
    # the limit on the request's span whichever field sent it
    assert next(s for s in spans if s["kind"] == SERVER)["attributes"]["gen_ai.request.max_tokens"] == 8
    assert all(s["attributes"]["gen_ai.usage.output_tokens"] > 0 for s in spans)
    before = {s["trace_id"] for s in receiver.spans}
    r = httpx.post(f"{url}/v1/completions", json={"model": STRONG, "prompt": "Once", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200
    new = None
    for _ in range(300):
        new = [s for s in list(receiver.spans) if s["trace_id"] not in before]
        if len(new) >= 2:
            break
        import time
        time.sleep(0.1)
    server = next(s for s in new if s["kind"] == SERVER)
    assert server["name"] == f"text_completion {STRONG}" and server["parent_id"] == ""  # a root


def test_a_refused_request_is_an_error_span(app):
    url, _, receiver = app
    trace_id, _, header = traceparent()
    r = httpx.post(f"{url}/v1/chat/completions", headers={"traceparent": header}, timeout=60,
                   json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404
    (span,) = receiver.trace(trace_id, 1)
    assert span["status"] == 2 and span["attributes"]["error.type"] == "404"  # STATUS_CODE_ERROR
