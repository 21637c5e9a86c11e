"""The request path's runner (``proxray.serve.stages.run``): each stage's ``before`` in order, a failure undone by
every stage entered in reverse order and re-raised, the answer's counts from each stage's ``answered``; the declared
path; and the rooms that must not read a body's output-limit fields (its ``TokenBound`` carries the limit). No Ray."""
import asyncio
import re

import pytest

from conftest import ROOT

from proxray.serve.errors import RequestError
from proxray.serve.stages import PATH, Flight, Stage, run


class Step(Stage):
    def __init__(self, name, log, fails=None, counts=True):
        super().__init__(None)
        self.name, self.log, self.fails, self.counts = name, log, fails, counts

    async def before(self, f):
        self.log.append(("before", self.name))
        if self.fails is not None:
            raise self.fails

    def failed(self, f, error):
        self.log.append(("failed", self.name, type(error).__name__))

    def answered(self, f):
        return (lambda usage: self.log.append(("count", self.name, usage))) if self.counts else None


def flight():
    return Flight(request=None, protocol=None, timeout_s=5.0)


@pytest.mark.parametrize("error", [RequestError(429, "over its rate"), asyncio.CancelledError()])
def test_a_failure_is_undone_by_every_stage_entered_in_reverse_and_raised(error):
    log = []
    stages = [Step("a", log), Step("b", log), Step("c", log, fails=error), Step("d", log)]
    with pytest.raises(type(error)):
        asyncio.run(run(stages, flight()))
    kind = type(error).__name__
    assert log == [("before", "a"), ("before", "b"), ("before", "c"),  # d never entered, nor told
                   ("failed", "c", kind), ("failed", "b", kind), ("failed", "a", kind)]


def test_an_answer_gets_each_stages_count_in_order():
    log = []
    stages = [Step("a", log), Step("b", log, counts=False), Step("c", log)]
    counts = asyncio.run(run(stages, flight()))
    for count in counts:
        count({"completion_tokens": 1})
    assert [e for e in log if e[0] == "count"] == [("count", "a", {"completion_tokens": 1}),
                                                  ("count", "c", {"completion_tokens": 1})]
    assert not [e for e in log if e[0] == "failed"]


def test_the_declared_path_admits_before_any_work_and_calls_last():
    names = [s.__name__ for s in PATH]
    assert names.index("Slot") < names.index("Hold") < names.index("Begin") < names.index("Plan") \
        < names.index("Rehold") < names.index("Call")
    assert names[:2] == ["Trace", "Counters"]  # every refusal reaches the spans and the counters


def test_no_stage_the_gate_pricing_or_the_turn_cost_reads_an_output_limit_field():
    """The output limit's field names are the protocols' and the wire's: the rest read a request's ``TokenBound``."""
    field = re.compile(r"""["']max_(tokens|completion_tokens|output_tokens)["']|LIMIT_FIELDS""")
    places = [ROOT / "proxray/serve/ingress.py", ROOT / "proxray/serve/gateway.py", ROOT / "proxray/common/pricing.py",
              *(ROOT / "proxray/serve/stages").glob("*.py"), *(ROOT / "proxray/serve/tenancy").glob("*.py"),
              *(ROOT / "proxray/serve/request").glob("*.py")]
    found = [f"{p.relative_to(ROOT)}:{i}" for p in places for i, line in enumerate(p.read_text().splitlines(), 1)
             if field.search(line)]
    assert found == []
