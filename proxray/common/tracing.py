"""OpenTelemetry traces of the gateway's requests: off unless the standard ``OTEL_*`` environment names an OTLP
endpoint, then one span per request with the router's decision and the model call under it.

On where every ingress replica has ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (a full URL, e.g.
``http://collector:4318/v1/traces``) or ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``/v1/traces`` is added) in its environment
(the Serve config's ``runtime_env.env_vars``), and ``OTEL_TRACES_EXPORTER`` is not ``none`` nor ``OTEL_SDK_DISABLED``
``true``. Spans go over OTLP/HTTP (protobuf) in batches (``OTEL_BSP_*``); ``OTEL_SERVICE_NAME`` names the service
(default ``proxray``), ``OTEL_EXPORTER_OTLP_HEADERS`` / ``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` carry a collector's key
(read by the exporter, never logged), ``OTEL_TRACES_SAMPLER`` samples as the SDK reads it.

Per request (GenAI semantic conventions, ``gen_ai.*``): a server span ``{operation} {requested model}`` continuing the
client's W3C ``traceparent`` where it sent one; under it ``route`` (encode, estimate, decide: the router's path, λ,
outlier score, chosen model) and a client span ``{operation} {model}`` over the model's answer (every candidate
asked, the fallbacks named), whose context an endpoint the gateway relays to is sent as ``traceparent``. Both end
when the answer ends (a stream's last event), with its token counts and cost."""
from __future__ import annotations

import contextvars
import logging
import os
import time

logger = logging.getLogger("ray.serve")
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
OPERATIONS = {"completions": "text_completion"}  # a protocol's GenAI operation; the rest are chat
TRACE_HEADERS: contextvars.ContextVar = contextvars.ContextVar("proxray_trace_headers", default=None)
_PROVIDER = None


def enabled(env=None) -> bool:
    """Whether this process exports traces: an OTLP endpoint named, and tracing not turned off."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return any(env.get(v, "").strip() for v in ENDPOINT_VARS)


def _tracer():
    """The process's tracer (its provider and OTLP/HTTP exporter made on first use, flushed at exit)."""
    global _PROVIDER
    if _PROVIDER is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL",
                                                                                      "http/protobuf"))
        if protocol != "http/protobuf":
            logger.warning("proxray: traces go over OTLP http/protobuf; OTEL_EXPORTER_OTLP_PROTOCOL=%s is not used",
                           protocol[:32])
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "proxray"})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _PROVIDER = provider
    return _PROVIDER.get_tracer("proxray")


class RequestTrace:
    """One request's spans (nothing at all where tracing is off: every method is then a no-op)."""

    def __init__(self, headers, protocol: str, on: bool):
        self.on, self.operation = on, OPERATIONS.get(protocol, "chat")
        self.span = self.model_span = None
        if not on:
            return
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract({k: headers[k] for k in ("traceparent", "tracestate")
                                                          if headers.get(k)})
        self.span = _tracer().start_span(self.operation, context=parent, kind=SpanKind.SERVER,
                                         attributes={"gen_ai.operation.name": self.operation,
                                                     "proxray.protocol": protocol})

    def requested(self, model: str, max_tokens=None) -> None:
        if self.span is not None:
            self.span.update_name(f"{self.operation} {model}")
            self.span.set_attribute("gen_ai.request.model", model)
            if isinstance(max_tokens, int):
                self.span.set_attribute("gen_ai.request.max_tokens", max_tokens)

    def routed(self, report: dict, chosen: str | None) -> None:
        """The router's decision (``chosen``: the model it asks first), as a ``route`` span over the report's
        ``route_ms``, ending now."""
        if self.span is None or not report.get("routed"):
            return
        start_ns = time.time_ns() - int(1e6 * report.get("route_ms", 0.0))
        from opentelemetry.trace import set_span_in_context

        attrs = {k: v for k, v in (("proxray.router_path", report.get("router_path")), ("proxray.lam", report.get("lam")),
                                   ("proxray.lam_from", report.get("lam_from")),
                                   ("proxray.outlier_score", report.get("outlier_score")),
                                   ("proxray.chosen_model", chosen))
                 if isinstance(v, (str, int, float, bool))}
        route = _tracer().start_span("route", context=set_span_in_context(self.span), start_time=start_ns,
                                     attributes=attrs)
        route.end()

    def calling(self) -> None:
        """The model call starts: its span, and its ``traceparent`` for an endpoint relayed from this request."""
        if self.span is None:
            return
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.model_span = _tracer().start_span(self.operation, context=set_span_in_context(self.span),
                                               kind=SpanKind.CLIENT,
                                               attributes={"gen_ai.operation.name": self.operation})
        carrier: dict = {}
        TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(self.model_span))
        TRACE_HEADERS.set(carrier)

    def _answered(self, model: str, report: dict) -> None:
        for span in (self.span, self.model_span):
            if span is not None:
                span.set_attribute("gen_ai.response.model", model)
                span.set_attribute("proxray.routed", bool(report.get("routed")))
        if self.model_span is not None:
            self.model_span.update_name(f"{self.operation} {model}")
            self.model_span.set_attribute("gen_ai.request.model", model)
            if report.get("fallback_from"):
                self.model_span.set_attribute("proxray.fallback_from", [str(m) for m in report["fallback_from"]])

    def finisher(self, model: str, report: dict, price, estimate: float | None):
        """``model`` answered (``report``: the fallbacks): a function of the answer's usage (chat words, as every count
        gets it) that ends both spans with its token counts and cost at ``price`` (``estimate`` where the model has
        none); None where tracing is off."""
        if self.span is None:
            return None
        self._answered(model, report)
        from proxray.common.pricing import Usage, answer_cost

        def finish(usage):
            self.finish(Usage.of_chat(usage), answer_cost(price, usage, estimate)[0])

        return finish

    def finish(self, usage=None, cost_usd: float | None = None) -> None:
        """The answer ended: its token counts and cost on both spans, and both ended (once)."""
        if self.span is None:
            return
        for span in (self.model_span, self.span):
            if span is None:
                continue
            if usage is not None:
                span.set_attribute("gen_ai.usage.input_tokens", int(usage.prompt))
                span.set_attribute("gen_ai.usage.output_tokens", int(usage.output))
                if usage.cache_read:
                    span.set_attribute("gen_ai.usage.cache_read.input_tokens", int(usage.cache_read))
            if cost_usd is not None:
                span.set_attribute("proxray.cost_usd", float(cost_usd))
            span.end()
        self.span = self.model_span = None

    def failed(self, status: int, message: str) -> None:
        if self.span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        for span in (self.model_span, self.span):
            if span is not None:
                span.set_attribute("error.type", str(status))
                span.set_status(Status(StatusCode.ERROR, message[:200]))
                span.end()
        self.span = self.model_span = None

