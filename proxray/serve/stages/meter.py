"""The served budget's meter (a budget on realised cost): the answer's usage counted toward it."""
from proxray.serve.stages.base import Stage


class BudgetMeter(Stage):
    def answered(self, f):
        return self.gw.policy.meter(f.plan, f.model, free=f.hit is not None)
