"""The answer's ``proxray`` report completed: the gateway's time, the replica, the key's part."""
import time

from proxray.serve.request.report import completed
from proxray.serve.stages.base import Stage


class Report(Stage):
    def answered(self, f):
        completed(f.plan.report, time.perf_counter() - f.t0, f.timings, self.gw.replica, f.gen, f.key_report,
                  f.key is not None)
