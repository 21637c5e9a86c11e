"""The gateway's metrics, exported with ``ray.util.metrics`` (Ray's Prometheus endpoint serves them with a
``ray_`` prefix; ``dashboards/proxray_grafana.json`` charts them)."""
from __future__ import annotations

ROUTING_MS_BOUNDARIES = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
OUTLIER_BOUNDARIES = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0]
NAMES = {"decisions": "proxray_routing_decisions", "routing_ms": "proxray_routing_latency_ms",
         "fallbacks": "proxray_fallbacks", "outlier": "proxray_outlier_score", "errors": "proxray_request_errors",
         "feedback": "proxray_feedback", "feedback_score": "proxray_feedback_score_sum"}


class GatewayMetrics:
    def __init__(self):
        from ray.util.metrics import Counter, Histogram

        self.decisions = Counter(NAMES["decisions"], "requests answered, by model and whether routed",
                                 tag_keys=("model", "routed"))
        self.routing_ms = Histogram(NAMES["routing_ms"], "time to route a request (encode + estimate + plan), ms",
                                    boundaries=ROUTING_MS_BOUNDARIES)
        self.fallbacks = Counter(NAMES["fallbacks"], "model calls that failed and passed the request on",
                                 tag_keys=("model",))
        self.outlier = Histogram(NAMES["outlier"], "outlier score of routed requests", boundaries=OUTLIER_BOUNDARIES)
        self.errors = Counter(NAMES["errors"], "requests answered with an error, by HTTP status", tag_keys=("code",))
        self.feedbacks = Counter(NAMES["feedback"], "feedback accepted on answers, by the model that answered",
                                 tag_keys=("model",))
        self.feedback_score = Counter(NAMES["feedback_score"], "sum of the feedback scores, by model (divided by "
                                      "proxray_feedback: the mean score)", tag_keys=("model",))
        self.planned = 0  # routed requests planned by this replica (the routing histogram's count, kept here too)

    def answered(self, model: str, routed: bool) -> None:
        self.decisions.inc(1, {"model": model, "routed": str(routed).lower()})

    def routed(self, ms: float, outlier: float) -> None:
        self.planned += 1
        self.routing_ms.observe(ms)
        self.outlier.observe(outlier)

    def fallback(self, model: str) -> None:
        self.fallbacks.inc(1, {"model": model})

    def error(self, code: int) -> None:
        self.errors.inc(1, {"code": str(code)})

    def feedback(self, model: str, score: float) -> None:
        self.feedbacks.inc(1, {"model": model})
        if score > 0:
            self.feedback_score.inc(float(score), {"model": model})
