"""Every metric proxray exports, defined once: the Ray metrics of the ingress, the relay to external endpoints and the
monitor's application (``ray.util.metrics``, served by Ray's Prometheus endpoint with a ``ray_`` prefix, a counter's
series ending in ``_total``, a histogram's in ``_bucket`` / ``_sum`` / ``_count``), and the series of the monitor's own
text (``proxray monitor metrics``). ``docs/reference/metrics.md`` is written from this table; a test scrapes a running
app and finds every series it sees here."""
from __future__ import annotations

from dataclasses import dataclass

ROUTING_MS_BOUNDARIES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
OUTLIER_BOUNDARIES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0)
LATENCY_S_BOUNDARIES = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


@dataclass(frozen=True)
class Metric:
    """One metric: ``kind`` counter, histogram or gauge; ``source``: who exports it (``ingress``, ``relay``,
    ``monitor``); ``when``: the event or setting before which a scrape does not show it (empty: from the first routed
    request)."""

    name: str
    kind: str
    help: str
    tags: tuple = ()
    source: str = "ingress"
    when: str = ""
    boundaries: tuple | None = None

    def scraped(self) -> list[str]:
        """The series names a Prometheus scrape of Ray's endpoint shows."""
        base = f"ray_{self.name}"
        if self.kind == "counter":
            return [f"{base}_total"]
        if self.kind == "histogram":
            return [f"{base}_bucket", f"{base}_sum", f"{base}_count"]
        return [base]

    def make(self):
        """The ``ray.util.metrics`` object (imported here, lazily: Ray is not imported with this module)."""
        from ray.util import metrics

        cls = {"counter": metrics.Counter, "histogram": metrics.Histogram, "gauge": metrics.Gauge}[self.kind]
        kw = {"boundaries": list(self.boundaries)} if self.boundaries else {}
        return cls(self.name, self.help, tag_keys=self.tags, **kw)


_KEYS = "a request of a `keys_file` key"
_RELAY = "a request to an `engine: openai` model"
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("proxray_routing_decisions", "counter", "requests answered, by the model that answered and whether it was "
           "routed", ("model", "routed")),
    Metric("proxray_routing_latency_ms", "histogram", "ms to route a request (encode + estimate + plan)",
           boundaries=ROUTING_MS_BOUNDARIES),
    Metric("proxray_outlier_score", "histogram", "outlier scores of routed requests", boundaries=OUTLIER_BOUNDARIES),
    Metric("proxray_fallbacks", "counter", "model calls that failed and passed the request on, by the model that "
           "failed", ("model",), when="a model failing a request"),
    Metric("proxray_request_errors", "counter", "requests answered with an error, by HTTP status", ("code",),
           when="an error answer"),
    Metric("proxray_feedback", "counter", "feedback accepted (`POST /v1/feedback`), by the model whose answer it "
           "scores", ("model",), when="a feedback post"),
    Metric("proxray_feedback_score_sum", "counter", "sum of the feedback scores, by model (divided by "
           "`ray_proxray_feedback_total`: the mean score)", ("model",), when="a feedback post with a score above 0"),
    Metric("proxray_key_requests", "counter", "requests of the keys file's API keys, by outcome: `ok`, `cheapest` "
           "(over budget, routed down), `rate`, `concurrent`, `budget`, `forbidden`", ("key", "outcome"),
           when=_KEYS),
    Metric("proxray_key_spend_usd", "counter", "USD of the answers given to each key (their usage at the models' "
           "prices, else the estimate)", ("key",), when=_KEYS),
    Metric("proxray_key_prompt_tokens", "counter", "prompt tokens of the answers given to each key, by whether the "
           "provider read them from its prompt cache (`cached`: `true`): the cached share", ("key", "cached"),
           when=_KEYS),
    Metric("proxray_cache_hits", "counter", "requests answered from the response cache, by kind (`exact`, "
           "`semantic`)", ("kind",), when="a `response_cache` hit"),
    Metric("proxray_cache_saved_usd", "counter", "USD the response cache's hits saved (what their answers cost when "
           "the model gave them)", when="a `response_cache` hit"),
    Metric("proxray_endpoint_latency_s", "histogram", "seconds to an external endpoint's answer or first chunk",
           ("model",), "relay", _RELAY, LATENCY_S_BOUNDARIES),
    Metric("proxray_endpoint_answers", "counter", "external endpoint calls, by model and HTTP status (0: no answer)",
           ("model", "status"), "relay", _RELAY),
    Metric("proxray_endpoint_rate_limited", "counter", "requests an external model's rate limit or concurrency cap "
           "held or refused", ("model",), "relay", "its `rate_limit` or cap reached"),
    Metric("proxray_endpoint_retries", "counter", "tries of a request again after its endpoint's 429, 5xx, timeout or "
           "refused connection", ("model",), "relay", "a retry"),
    Metric("proxray_endpoint_cooldowns", "counter", "times a model was taken out of routing: its endpoint refused the "
           "gateway's key (401, 403) or does not serve it (404)", ("model", "status"), "relay",
           "an endpoint refusing the gateway's key"),
    Metric("proxray_monitor_served_version", "gauge", "the router version served", (), "monitor",
           "the monitor's Serve application"),
    Metric("proxray_monitor_candidate_version", "gauge", "the version in its shadow window; -1: none", (), "monitor",
           "the monitor's Serve application"),
    Metric("proxray_monitor_gate_decisions", "counter", "gate decisions, by decision (promoted, rejected)",
           ("decision",), "monitor", "a gate decision"),
    Metric("proxray_monitor_gate_last_decision", "gauge", "1 for the last decision (its version, decision and reason, "
           "cut to 160 characters), 0 for the one before", ("version", "decision", "why"), "monitor",
           "a gate decision"),
    Metric("proxray_monitor_label_source_agreement", "gauge", "a label source's agreement with its spot checks",
           ("source",), "monitor", "a spot-checked label source"),
    Metric("proxray_monitor_label_source_set_aside", "gauge", "1: the source trains nothing more", ("source",),
           "monitor", "a spot-checked label source"),
)}

# the monitor's own Prometheus text (``proxray monitor metrics``, ``proxray.monitor.views.prometheus_text``):
# name -> (type, labels, meaning)
MONITOR_TEXT: dict[str, tuple[str, str, str]] = {
    "proxray_monitor_reported_total": ("counter", "", "routed requests the ingress replicas reported"),
    "proxray_monitor_drifted_total": ("counter", "", "those the monitor counted as outliers (drifted)"),
    "proxray_monitor_outlier_rate": ("gauge", "", "share of recent reports that drifted"),
    "proxray_monitor_drift_queue": ("gauge", "", "drifted queries waiting to be evaluated"),
    "proxray_monitor_shadow_labelled": ("gauge", "", "queries of the candidate's shadow window labelled so far"),
    "proxray_monitor_evaluations_total": ("counter", "", "evaluation jobs run"),
    "proxray_monitor_spent_usd": ("counter", "", "USD the evaluations spent"),
    "proxray_monitor_router_version": ("gauge", "", "the latest router version written"),
    "proxray_monitor_served_version": ("gauge", "", "the router version served"),
    "proxray_monitor_topz_overlap_threshold": ("gauge", "", "J_z below which a traffic group counts as drifted"),
    "proxray_monitor_feedback_received_total": ("counter", "", "feedback rows received"),
    "proxray_monitor_feedback_absorbed_total": ("counter", "", "feedback rows absorbed into the table (or merged)"),
    "proxray_monitor_feedback_pending": ("gauge", "", "feedback rows waiting"),
    "proxray_monitor_candidate_version": ("gauge", "", "the version in its shadow window; -1: none"),
    "proxray_monitor_gate_decisions_total": ("counter", "decision", "gate decisions so far"),
    "proxray_monitor_gate_last_decision": ("gauge", "version, decision", "1 for the last decision"),
    "proxray_monitor_label_source_agreement": ("gauge", "source", "a label source's agreement with its spot checks"),
    "proxray_monitor_label_source_checked": ("gauge", "source", "its cells spot-checked"),
    "proxray_monitor_label_source_set_aside": ("gauge", "source", "1: the source trains nothing more"),
    "proxray_monitor_topz_overlap": ("gauge", "traffic", "J_z of recent traffic (inlier, outlier) against the table"),
    "proxray_monitor_group_topz_overlap": ("gauge", "group", "J_z per traffic group"),
}


def metric(name: str):
    """The ``ray.util.metrics`` object of the metric ``name`` of ``METRICS``."""
    return METRICS[name].make()
