"""The key's rate and budget (``KeyGate``): admitted before any work on the request, with a hold of its body as sent
at the dearest model it may reach (``Hold``); once planned, the hold moved to the chosen model's bound on the whole
turn (``Rehold``); settled exactly once — by the answer's usage, or released where no answer came. The body's token
bound is measured once a request (``bound``), again only where its turn outgrew what it sent (``Turn.grown``)."""
from proxray.serve.errors import RequestError
from proxray.serve.protocols.core import as_sent
from proxray.serve.stages.base import Stage
from proxray.serve.tenancy.gate import Held
from proxray.serve.wire import measure


def bound(f, default_max_tokens):
    """The request's ``TokenBound``: its turn's body once begun, else its body as sent; measured once."""
    if f.bound is None:
        f.bound = measure(f.turn.body if f.turn is not None else as_sent(f.req, default_max_tokens))
    return f.bound


class Hold(Stage):
    async def before(self, f):
        gw = self.gw
        f.held = Held(gw.gate, f.key)
        reach = gw.policy.reach(f.rp) if f.routed else [f.req.model]
        budgeted = f.key is not None and f.key.budget is not None  # only a budget's hold needs the body measured
        f.key_report, past, f.first_hold = await gw.gate.admit_request(
            f.key, bound(f, gw.args.default_max_tokens) if budgeted else None, f.held.take, reach, f.routed,
            gw.client.handles)
        if past:  # over a ``cheapest`` budget: cost decides its plan
            f.rp = f.rp.over_budget()

    def failed(self, f, error):
        if f.held is None or f.read_on:  # read on: settled when its answer ends (``stages.call``)
            return
        if isinstance(error, RequestError):  # nothing spent, unless a model had it past the deadline (a 504)
            keyed = f.plan is not None and f.key is not None
            f.held.refused(error.status, f.plan, bound(f, self.gw.args.default_max_tokens) if keyed else None,
                           reached=f.reached is not None and f.reached.model is not None)
        else:  # an unexpected failure, or the client gone before the answer: nothing spent
            f.held.release()

    def answered(self, f):  # a hosted provider's prompt cache is every key's: charged as if it had missed
        if f.hit is not None:  # answered from the response cache: nothing spent
            f.held.release()
            return None
        return f.held.charger(f.model, f.estimate, f.bound, shared_cache=self.gw.client.relayed(f.model))


class Rehold(Stage):
    async def before(self, f):
        gw = self.gw
        chosen = f.plan.candidates[0]
        f.estimate = f.plan.cost_of(chosen)
        if f.key is None:
            return
        turn_bound = bound(f, gw.args.default_max_tokens)  # what its answer is charged at, and a relay's limit books
        if not f.key.budget:
            return
        if f.estimate is None and chosen not in gw.gate.prices:  # a named model with no price: the router's estimate
            f.estimate = await gw.estimate(f.text, chosen)
        held, again = await gw.gate.hold_plan(f.key, f.key_report, f.plan, turn_bound, f.held.ticket, f.first_hold,
                                              f.estimate, gw.client.handles)
        if again:  # over a ``cheapest`` budget once the turn outgrew its admission: cost decides
            f.plan = await gw.plan(f.req, f.rp.over_budget(), f.turn, f.timings, f.text, f.key, again=True)
            f.estimate = f.plan.report["estimates"][f.plan.candidates[0]]["cost"]
        first = f.plan.candidates[0]

        async def before_fallback(model):  # a dearer candidate after the first failed: held at its bound first
            nonlocal held
            if model != first:
                held = await gw.gate.hold_fallback(f.key, f.held.ticket, model, f.bound, f.plan.cost_of(model), held)

        f.before_fallback = before_fallback
