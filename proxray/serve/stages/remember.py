"""The answer remembered for feedback on it (``POST /v1/feedback``), with its routing text and cost."""
from proxray.serve.stages.base import Stage


class Remember(Stage):
    def answered(self, f):
        gw = self.gw
        if len(f.text) > gw.args.max_prompt_chars:
            return None
        return gw.answers.recorder(f.turn.answer_id(f.head[0]), f.text, f.model, f.owner, gw.gate.prices.get(f.model),
                                   f.estimate)
