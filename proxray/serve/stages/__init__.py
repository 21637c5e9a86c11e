"""The request path as declared stages (``Stage``: before the call, on a failure, on an answer) over one request's
``Flight``, run in this order by ``run``; a failure undoes what the stages entered took, in reverse order. A new
per-key rule or a new count of answers is one stage module and one row of ``PATH``. No stage names a protocol."""
from proxray.serve.stages.answer import respond
from proxray.serve.stages.base import Flight, Stage, run
from proxray.serve.stages.cache import Keep, Lookup
from proxray.serve.stages.call import Call
from proxray.serve.stages.conversation import Conversation
from proxray.serve.stages.counters import Counters
from proxray.serve.stages.hold import Hold, Rehold
from proxray.serve.stages.meter import BudgetMeter
from proxray.serve.stages.parse import Parse
from proxray.serve.stages.plan import Plan
from proxray.serve.stages.remember import Remember
from proxray.serve.stages.report import Report
from proxray.serve.stages.slot import Slot
from proxray.serve.stages.trace import Trace
from proxray.serve.stages.turn import Begin

# the order every request crosses them: the spans and counters first (every refusal is on them), the body read and
# checked, the key's slot and its admission before any work on the request, the turn begun, its conversation, the
# plan, the hold moved to the chosen model, the response cache asked, the call; on an answer, the report completed and
# what counts its usage, the answer kept in the cache last (it reads the stream the others are shown)
PATH = (Trace, Counters, Parse, Slot, Hold, Begin, Conversation, Plan, Rehold, Lookup, Call, Report, BudgetMeter,
        Remember, Keep)


def path(gw, stages=PATH) -> list:
    """The stages of one ingress replica, over its ``Gateway``."""
    return [stage(gw) for stage in stages]


__all__ = ["PATH", "Flight", "Stage", "path", "respond", "run"]
