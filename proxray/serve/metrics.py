"""The gateway's metrics, exported with ``ray.util.metrics`` (Ray's Prometheus endpoint serves them with a
``ray_`` prefix; ``dashboards/proxray_grafana.json`` charts them); every one is defined in
``proxray.common.metric_defs``."""
from __future__ import annotations



class GatewayMetrics:
    """The ingress's metrics (defined in ``proxray.common.metric_defs``)."""

    def __init__(self):
        from proxray.common.metric_defs import metric

        self.decisions = metric("proxray_routing_decisions")
        self.routing_ms = metric("proxray_routing_latency_ms")
        self.fallbacks = metric("proxray_fallbacks")
        self.outlier = metric("proxray_outlier_score")
        self.errors = metric("proxray_request_errors")
        self.feedbacks = metric("proxray_feedback")
        self.feedback_score = metric("proxray_feedback_score_sum")
        self.cache_hits = metric("proxray_cache_hits")
        self.cache_saved = metric("proxray_cache_saved_usd")
        self.planned = 0  # routed requests planned by this replica (the routing histogram's count, kept here too)

    def answered(self, model: str, routed: bool) -> None:
        self.decisions.inc(1, {"model": model, "routed": str(routed).lower()})

    def routed(self, ms: float, outlier: float) -> None:
        self.planned += 1
        self.routing_ms.observe(ms)
        self.outlier.observe(outlier)

    def cache_hit(self, kind: str, saved_usd: float | None) -> None:
        self.cache_hits.inc(1, {"kind": kind})
        if saved_usd:
            self.cache_saved.inc(float(saved_usd))

    def fallback(self, model: str) -> None:
        self.fallbacks.inc(1, {"model": model})

    def error(self, code: int) -> None:
        self.errors.inc(1, {"code": str(code)})

    def feedback(self, model: str, score: float) -> None:
        self.feedbacks.inc(1, {"model": model})
        if score > 0:
            self.feedback_score.inc(float(score), {"model": model})
