"""What a stage of the request path is (``Stage``), the state one request carries through them (``Flight``) and the
runner (``run``): each stage's ``before`` in order; on a failure, each stage entered is told (``failed``) in reverse
order, so what a stage took (a slot, a hold, a span) it gives back itself; on an answer, each stage's ``answered``
gives what it counts of the answer's usage (or None)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Flight:
    """One request on its way: what the stages found so far, for the stages after them."""

    request: Any  # the HTTP request (starlette)
    protocol: Any  # its ``Protocol`` row
    timeout_s: float
    t0: float = field(default_factory=time.perf_counter)
    deadline: float = 0.0
    timings: dict = field(default_factory=dict)  # where the gateway's time went: read, parse, embed, estimate, model
    trace: Any = None  # its ``RequestTrace`` (nothing where tracing is off)
    key: Any = None  # its ``KeySpec`` (None: the app's single key, or no auth)
    owner: str | None = None  # the key's tenancy (None for the app's single key, or no auth)
    req: Any = None  # the parsed request
    rp: Any = None  # its ``RequestPolicy``
    routed: bool = False  # sent to the router (``model: proxray`` or an alias that routes)
    slot: Any = None  # its place among its key's requests in flight
    held: Any = None  # its key's hold on its budget (``Held``)
    key_report: dict | None = None  # the key's part of the answer's report
    first_hold: float = 0.0  # the USD held at admission
    turn: Any = None  # the one request every candidate is sent (``Turn``)
    text: str = ""  # the routing text
    bound: Any = None  # its ``TokenBound``, measured once (``wire.measure``): what holds and charges take
    facts: Any = None  # a conversation's turn facts (``TurnFacts``)
    plan: Any = None  # the plan: candidates in order, the report
    estimate: float | None = None  # what the answer is charged at without usage
    before_fallback: Any = None  # awaited with each candidate before it is asked (the key's hold raised for it)
    reached: Any = None  # whether it reached a model (``wire.Reached``): a 504 before that is charged nothing
    read_on: bool = False  # its client left and its answer is read on to charge its key (``stages.call``)
    cache: dict | None = None  # where a miss's answer is kept (``stages.cache``): its scope, keys and embedding
    hit: str | None = None  # answered from the response cache: how (exact, semantic); charged nothing
    model: str | None = None  # the model that answered
    head: Any = None  # its answer, or its stream's first content
    gen: Any = None  # the rest of its stream

    def __post_init__(self):
        self.deadline = time.monotonic() + self.timeout_s


class Stage:
    """One concern of the request path, over a ``Flight``: ``before`` the model is called (it may raise a
    ``RequestError``), ``failed`` when the request ends without an answer (``error``: a ``RequestError``, or what
    ended it otherwise — the client gone, a bug), ``answered`` once a model answered: a function of the answer's
    usage (chat words) to count it, or None. ``gw`` is the replica's ``Gateway``."""

    def __init__(self, gw):
        self.gw = gw

    async def before(self, f: Flight) -> None:
        return None

    def failed(self, f: Flight, error: BaseException) -> None:
        return None

    def answered(self, f: Flight) -> Callable | None:
        return None


async def run(stages, f: Flight) -> list:
    """``f`` through ``stages``; returns the answer's counts. A failure is re-raised after every stage entered,
    the failing one included, was told in reverse order."""
    entered = []
    try:
        for stage in stages:
            entered.append(stage)
            await stage.before(f)
    except BaseException as e:
        for stage in reversed(entered):
            stage.failed(f, e)
        raise
    return [c for c in (stage.answered(f) for stage in stages) if c is not None]
