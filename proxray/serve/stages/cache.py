"""The response cache (``response_cache`` of the app args; ``proxray.serve.request.cache``,
``proxray.serve.tenancy.response_cache``): ``Lookup`` answers a cacheable request from its scope's entries before any
model is asked — an exact repeat; or the same ask written otherwise (its text's ``text_key``), the rest of the request
the same; or, where ``similarity`` is set, the routed request whose routing embedding is nearest within it — and
``Keep`` stores a miss's answer once it ended whole. A hit is the
answering model's kept answer, replayed through the same protocol turn as a model's own (whole or streamed), with its
usage zeroed: its key is charged nothing, and its report says ``cache``."""
import logging

from proxray.common.pricing import answer_cost
from proxray.common.shared_actor import SharedStateDown
from proxray.serve.request.cache import (Recorder, Replay, ids_of, keys_of, kinds_for, replayed, scope_of, text_key,
                                         why_not, zero_usage)
from proxray.serve.request.fallback import answered_by
from proxray.serve.stages.base import Stage
from proxray.serve.tenancy.response_cache import objects_json

logger = logging.getLogger("ray.serve")


class Lookup(Stage):
    async def before(self, f):
        gw = self.gw
        spec = gw.args.response_cache
        if spec is None or f.plan is None or not f.plan.candidates:
            return
        exact_on, semantic_on = kinds_for(f.key, spec)
        opted_out = f.req.proxray is not None and f.req.proxray.cache is False
        why = why_not(f.turn.body, f.turn, spec, opted_out) if exact_on or semantic_on else "off for the key"
        if why is not None:
            f.plan.report["cache"] = {"kind": "off", "why": why}
            return
        model, proto, stream = f.plan.candidates[0], f.protocol.name, bool(f.req.stream)
        exact, constraint = keys_of(proto, stream, model, f.turn.body)
        f.cache = {"scope": scope_of(f.key), "exact": exact, "constraint": constraint if semantic_on else None,
                   "vector": f.plan.vector if semantic_on and spec.similarity else None,
                   "text": text_key(f.text) if semantic_on else None}
        try:
            hit = await gw.cache.get(f.cache["scope"], exact if exact_on else None, f.cache["constraint"],
                                     f.cache["vector"], spec.similarity, f.cache["text"])
        except SharedStateDown as e:  # the cache lost, not the request: a miss that says why (its answer still kept)
            logger.warning("proxray: %s: %s; answered by the model", e.name, e.why)
            f.plan.report["cache"] = {"kind": "miss", "why": f"the cache did not answer ({e.why})"}
            return
        if hit is None:
            f.plan.report["cache"] = {"kind": "miss"}
            return
        objects = replayed(hit["objects"], hit["ids"])
        f.model, f.head = hit["model"], objects[:hit["head"]]
        f.gen = Replay(objects[hit["head"]:]) if stream else None
        f.estimate, f.cache, f.hit = 0.0, None, hit["kind"]  # a hit is charged nothing, and not kept again
        answered_by(f.plan, f.model)
        f.plan.report["cache"] = {"kind": hit["kind"], "saved_usd": hit["cost_usd"],
                                  **({"match": hit["match"], "similarity": hit["similarity"]}
                                     if hit["kind"] == "semantic" else {})}
        gw.metrics.cache_hit(hit["kind"], hit["cost_usd"])


class Keep(Stage):
    def answered(self, f):
        if f.cache is None:
            return None
        gw, stream, head = self.gw, bool(f.req.stream), list(f.head)
        if stream:
            f.gen = recorder = Recorder(f.gen)
        answer_id = f.turn.answer_id(head[0])
        price = gw.gate.prices.get(f.model)

        def keep(usage):
            if usage is None or (stream and not recorder.complete):  # ended early, or without its usage
                return
            objects = head + (recorder.seen if stream else [])
            gw.cache.put(f.cache["scope"], f.cache["exact"], {
                "model": f.model, "objects": objects_json(zero_usage(objects)), "head": len(head),
                "ids": ids_of(head[0]), "answer_id": answer_id, "cost_usd": answer_cost(price, usage, f.estimate)[0],
                "constraint": f.cache["constraint"], "vector": f.cache["vector"], "text": f.cache["text"]})

        return keep
