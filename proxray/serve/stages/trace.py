"""The request's OpenTelemetry spans (``proxray.common.tracing``): opened first, so that every refusal is on them;
ended with the answer's tokens and cost, or with the error."""
from proxray.common.tracing import RequestTrace
from proxray.serve.errors import RequestError
from proxray.serve.stages.base import Stage


class Trace(Stage):
    async def before(self, f):
        f.trace = RequestTrace(f.request.headers, f.protocol.name, self.gw.tracing)

    def failed(self, f, error):
        if isinstance(error, RequestError):
            f.trace.failed(error.status, error.message)
        else:
            f.trace.failed(500, type(error).__name__)

    def answered(self, f):
        return f.trace.finisher(f.model, f.plan.report, self.gw.gate.prices.get(f.model), f.estimate)
