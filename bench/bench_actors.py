"""How many calls a second each of the app's shared actors carries, from many callers at once (not a timed test).

    python bench/bench_actors.py [--seconds 3] [--callers 1,8,32] [--shards 4] [--json]

Every ingress replica of an app calls the same named actors: the keys ledger (an admission and a settle per keyed
request), the conversations book, the answer book, the Responses store and an endpoint's limiter. Each is created here
as the app creates it (``proxray.common.shared_actor.app_actor``: no CPU reserved, calls out of order), beside a
no-op actor (Ray's own ceiling for one actor on this machine), and driven by caller actors standing in for ingress
replicas: ``c`` calls in flight at once, spread over up to 8 callers, for ``--seconds``, each kind's calls as one
request makes them (a write and a read; a conversation's turn three: its lookup, its model and prompt, its output)
in turn. Printed per actor and per ``c``: calls a second, p50 and p99 latency in ms; ``ledger_<n>_shards``: the
ledger split over ``--shards`` actors by key (``keys_ledger_shards``), each call to the shard of its key. ``--json``: one line, ``{actor: {c: {calls_s, p50_ms, p99_ms}}}``.
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # the benchmark's own local cluster

BUDGET = {"usd": 1e12, "window_s": 86400.0, "over_budget": "reject"}


class Noop:
    def ping(self, *args):
        return None


def calls(kind: str, i: int) -> list:
    """The (method, args) a request makes of actor ``kind``, the ``i``-th request of a caller."""
    key = f"k{i % 256}"  # many tenants: spread over the ledger's shards
    if kind == "ledger":
        ticket = f"t{i}"
        return [("admit", (key, 1e12, BUDGET, 1e-4, ticket)), ("settle", (key, ticket, 1e-4))]
    if kind == "conversations":
        cid = f"c{i % 1000}"  # a turn: what the book holds of the conversation, its model and prompt, its output
        return [("session", (cid,)), ("remember", (cid, "m", 20_000 + i)), ("told", (cid, 512))]
    if kind == "answers":
        return [("remember", (f"a{i}", {"text": "What is 17 times 23?", "model": "m", "key": key}))]
    if kind == "responses":
        return [("remember", (f"r{i}", {"text": '{"output": []}', "key": key, "previous": None})),
                ("get", (f"r{i}", key))]
    if kind == "limiter":
        return [("reserve", (64, 1.0, None, (None, 1e12)))]
    return [("ping", ())]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--callers", default="1,8,32", help="calls in flight at once, comma-separated")
    p.add_argument("--shards", type=int, default=4, help="the sharded ledger's actors (0: not measured)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    levels = [int(x) for x in a.callers.split(",")]

    import ray

    from proxray.common.actors import NAMESPACE
    from proxray.common.shared_actor import app_actor
    from proxray.pool.openai_engine import RateLimiter
    from proxray.serve.tenancy.conversations import ConversationBook
    from proxray.serve.tenancy.feedback import AnswerBook
    from proxray.serve.tenancy.keys import KeyLedger
    from proxray.serve.tenancy.ledger import shard_of
    from proxray.serve.tenancy.responses import ResponseBook

    @ray.remote(num_cpus=0)
    class Caller:  # an ingress replica's share of the load: ``inflight`` requests at once on its event loop
        def __init__(self, names: list, kind: str):
            self.actors, self.kind = [ray.get_actor(n, namespace=NAMESPACE) for n in names], kind

        async def drive(self, inflight: int, seconds: float, seed: int) -> list:
            import asyncio

            end, lat = time.monotonic() + seconds, []

            async def one(j):
                i = seed * 1_000_000 + j * 100_000
                while time.monotonic() < end:
                    for method, args in calls(self.kind, i):
                        actor = self.actors[shard_of(args[0], len(self.actors))] if len(self.actors) > 1 else self.actors[0]
                        t0 = time.perf_counter()
                        await getattr(actor, method).remote(*args)
                        lat.append(time.perf_counter() - t0)
                    i += 1

            await asyncio.gather(*(one(j) for j in range(inflight)))
            return lat

    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False, namespace=NAMESPACE)
    kinds = {"ledger": (KeyLedger, (), 1), "conversations": (ConversationBook, (), 1), "answers": (AnswerBook, (), 1),
             "responses": (ResponseBook, (), 1), "limiter": (RateLimiter, (None, 1e12), 1), "noop": (Noop, (), 1)}
    if a.shards > 1:
        kinds[f"ledger_{a.shards}_shards"] = (KeyLedger, (), a.shards)
    out: dict = {}
    try:
        for label, (cls, args, shards) in kinds.items():
            kind = "ledger" if label.startswith("ledger") else label
            names = [f"proxray-bench-{label}-{s}" for s in range(shards)]
            actors = [app_actor(cls, name, *args) for name in names]
            ray.get([getattr(x, calls(kind, 0)[0][0]).remote(*calls(kind, 0)[0][1]) for x in actors])  # answering
            out[label] = {}
            for c in levels:
                n = min(c, 8)
                callers = [Caller.remote(names, kind) for _ in range(n)]
                shares = [c // n + (1 if i < c % n else 0) for i in range(n)]
                ray.get([x.drive.remote(1, 0.2, 0) for x in callers])  # warm: each caller's connection made
                lats = sorted(sum(ray.get([x.drive.remote(s, a.seconds, i + 1) for i, (x, s) in
                                           enumerate(zip(callers, shares))]), []))
                q = lambda f: round(1e3 * lats[min(int(f * len(lats)), len(lats) - 1)], 3)  # noqa: E731
                out[label][str(c)] = {"calls_s": round(len(lats) / a.seconds, 1), "p50_ms": q(0.5), "p99_ms": q(0.99)}
                for x in callers:
                    ray.kill(x)
                if not a.json:
                    print(f"{label:16s} c={c:3d}  {out[label][str(c)]}", flush=True)
            for x in actors:
                ray.kill(x)
    finally:
        ray.shutdown()
    print(json.dumps({"machine": f"{os.cpu_count()} cores", "seconds": a.seconds, "actors": out}) if a.json else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
