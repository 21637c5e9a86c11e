"""The gateway's request counters (``GatewayMetrics``): a refusal by its status, an answer by its model."""
from proxray.serve.errors import RequestError
from proxray.serve.stages.base import Stage


class Counters(Stage):
    def failed(self, f, error):
        if isinstance(error, RequestError):
            self.gw.metrics.error(error.status)

    def answered(self, f):
        self.gw.metrics.answered(f.model, f.plan.report["routed"])
