"""The conversation a turn continues (a stored response's, or one the client names): its replica for co-hosted
models, its facts for the cache-aware rule; the model that answered carries it on, with its prompt in its cache."""
from proxray.serve.request.turn_cost import turn_facts
from proxray.serve.stages.base import Stage
from proxray.serve.stages.hold import bound
from proxray.serve.tenancy.conversations import named


class Conversation(Stage):
    async def before(self, f):
        gw = self.gw
        f.rp = named(f.rp, f.turn.previous_id, f.turn.session)
        gw.client.session(f.rp.conversation, f.owner if f.key is not None else "")
        if f.rp.conversation is not None and f.routed:
            f.facts = turn_facts(bound(f, gw.args.default_max_tokens), gw.native[f.protocol.name], gw.policy.routable)

    def answered(self, f):
        conversation = f.plan.report.get("conversation")
        if conversation and f.turn.previous_id is None:
            return self.gw.conversations.carry_on(conversation["id"], f.model, f.owner, f.facts)
        return None
