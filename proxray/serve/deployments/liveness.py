"""Whether a model deployment can answer now, told in well under a second — not when a request's deadline runs out.

A replica whose node is lost (a spot reclaim, a kernel panic, a GPU off the bus) does not answer, and nothing tells its
callers soon: Ray marks the node dead only after its missed heartbeats, and until then Serve's handle keeps a request
queued for a deployment whose only replica is gone. So every model deployment says something at least every
``HEARTBEAT_S`` while it works on a request (``OpenAIModel.respond`` with ``heartbeat_s``: ``BEAT`` whenever the engine
has been quiet that long; an answer that comes sooner travels alone), and the ingress reads the stream through a
``WatchedStream``:

* **taken** — a model that has not taken the request within ``failover_s`` (its replica dead, still starting, or every
  slot busy) is passed over when another candidate remains; as the request's last candidate it is waited for only
  while one of its replicas is alive (``Liveness.live``), else the request gets a 503 naming it, with Retry-After.
* **silent** — a model that took the request and then said nothing, not even its heartbeat, for ``failover_s`` lost
  the replica that had it: the next candidate answers (a stream that had begun ends with its error event).
* **down** — a model none of whose replicas answers a probe, and none of whose replicas Serve's controller knows on a
  live node (``replica_coming``: a busy replica, one starting, one lost on a live node that Serve replaces), is left out
  (routed requests try it last; a request naming it gets a 503 with Retry-After at once) until a probe finds a live
  replica again (every ``REPROBE_S``). A replica being replaced is waited for, within the request's ``timeout_s``; a
  model with no replica placed anywhere or only on a node that is gone is down at once.
* **out** — a relayed model whose endpoint refused the gateway's key or does not know it is taken out by its relay
  (``take_out``) for the relay's cool-down: routed requests try it last until then, instead of trying it first and
  paying the round trip each time.

A live model that is merely slow (a 70B model on a long prompt) is never cut off: it took the request and its
heartbeat keeps coming. The probe asks each of the deployment's replica actors for its number of ongoing requests —
the call Serve's own router uses, answered on a thread of its own, so a busy replica answers it at once.
An in-process model (an endpoint relayed from the ingress) has no replica to lose: its stream is not watched.
"""
from __future__ import annotations

import asyncio
import logging
import time

from proxray.serve.deployments.readiness import app_deployments

BEAT = {"object": "proxray.heartbeat"}  # what a deployment yields while it works on a request and its engine is quiet
HEARTBEAT_S = 0.25  # how often a quiet deployment says it is still working on a request
PROBE_S = 0.5  # how long a replica may take to answer a liveness probe
REPROBE_S = 1.0  # how often a model that is down (or was slow to take a request) is probed again
SLOW_S = 5.0  # a model that was slow to take a request is tried last this long (unless a probe finds it down)
logger = logging.getLogger("ray.serve")


def is_beat(obj) -> bool:
    return isinstance(obj, dict) and obj.get("object") == BEAT["object"]


async def heartbeats(gen, every_s: float):
    """``gen``'s objects, with ``BEAT`` whenever ``gen`` was quiet for ``every_s`` (the deployment side). Nothing is
    added to an answer that comes sooner: a request is taken when its first object, answer or beat, arrives."""
    it = gen.__aiter__()
    pending = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                yield BEAT
                continue
            task, pending = pending, None
            try:
                obj = task.result()
            except StopAsyncIteration:
                return
            yield obj
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        if hasattr(it, "aclose"):
            await it.aclose()  # now, not when the collector finds it (the engine's generation stops with it)


class ModelUnavailable(Exception):
    """No replica of the model answers: a request naming it gets a 503 with Retry-After (``REPROBE_S``)."""

    def __init__(self, model: str, why: str):
        self.model = model
        super().__init__(f"model {model!r} has no live replica ({why})")


class ReplicaLost(Exception):
    """The model took the request (or not) and then said nothing within ``failover_s``."""


class Liveness:
    """This ingress replica's view of which model deployments have a live replica (``app``: the Serve app's name;
    ``deployments``: model id -> deployment name, for the models reached through a handle)."""

    def __init__(self, app: str | None, deployments: dict, failover_s: float):
        self.app, self.deployments, self.failover_s = app, deployments, failover_s
        self.down: dict = {}  # model -> when a probe found no live replica
        self.slow: dict = {}  # model -> until when it is tried last
        self.asked: dict = {}  # model -> (when, the probe's future): one probe at a time per model
        self.out: dict = {}  # model -> until when its relay took it out of routing
        self.watcher = None  # the task that probes down and slow models again

    def watched(self, model: str) -> bool:
        return self.app is not None and model in self.deployments

    def order(self, candidates: list) -> list:
        """``candidates`` with the models taken out by their relay, known down, or slow to take requests moved last
        (order kept)."""
        now = time.monotonic()
        rank = {m: 3 if self.out.get(m, 0) > now else 2 if m in self.down else 1 if self.slow.get(m, 0) > now else 0
                for m in candidates}
        return sorted(candidates, key=lambda m: rank[m])

    def take_out(self, model: str, seconds: float) -> None:
        """A relayed model's endpoint cannot serve it for now (its relay's word): tried last for ``seconds``."""
        self.out[model] = time.monotonic() + seconds

    def unavailable(self, model: str) -> ModelUnavailable | None:
        if model in self.down:
            return ModelUnavailable(model, f"none answered for {time.monotonic() - self.down[model]:.1f} s")
        return None

    def suspect(self, model: str, why: str, slow: bool = True) -> None:
        """A request found ``model`` slow to take it or silent: try it last (``slow``), and probe it now. A replica
        Ray says died is not a slow model: Serve's router has dropped it and the model's other replicas take its
        requests; the probe alone says whether any is left."""
        if not self.watched(model):
            return
        logger.warning("proxray: model %s %s; probing its replicas", model, why)
        if slow:
            self.slow[model] = time.monotonic() + SLOW_S
        asyncio.get_running_loop().create_task(self.live(model))
        self._watch()

    async def live(self, model: str) -> bool:
        """Whether any replica of ``model`` answers a probe within ``PROBE_S`` (asked at most once per ``PROBE_S``)."""
        if not self.watched(model):
            return True
        now = time.monotonic()
        when, fut = self.asked.get(model, (0.0, None))
        if fut is None or (fut.done() and now - when > PROBE_S):
            fut = asyncio.ensure_future(self._probe(model))
            self.asked[model] = (now, fut)
        alive = await asyncio.shield(fut)
        if alive:
            if self.down.pop(model, None) is not None:
                logger.warning("proxray: model %s has a live replica again", model)
        elif model not in self.down:
            logger.warning("proxray: model %s has no live replica: requests naming it get 503 until one answers", model)
            self.down[model] = time.monotonic()
            self._watch()
        return alive

    async def _probe(self, model: str) -> bool:
        """Whether ``model`` has a replica that answers, or one that will: a replica answering the probe, else one
        that Serve's controller knows on a node whose raylet answers — alive but too busy to answer in ``PROBE_S``
        (a vLLM engine on its CPU), placed and starting, or dead on a live node, which Serve replaces. A replica whose
        node is gone (its raylet does not answer, or the GCS says it is dead) or that waits for room on none is no
        replica: with no other, the model is down. A timed-out probe alone never says a model is down."""
        import ray

        prefix = f"SERVE_REPLICA::{self.app}#{self.deployments[model]}#"
        try:  # every lookup bounded: a probe that hangs would keep the model down for every later probe
            names = await asyncio.wait_for(asyncio.to_thread(ray.util.list_named_actors, True), PROBE_S)
        except Exception:  # noqa: BLE001 - the GCS unreachable or too slow: nothing learnt, assume it lives
            return True
        replicas = [n["name"] for n in names if n["namespace"] == "serve" and n["name"].startswith(prefix)]

        async def one(name):
            try:
                actor = await asyncio.wait_for(asyncio.to_thread(ray.get_actor, name, "serve"), PROBE_S)
                await asyncio.wait_for(actor.get_num_ongoing_requests.remote(), PROBE_S)
                return True
            except Exception:  # noqa: BLE001 - dead, unreachable or too slow: asked of the controller next
                return False

        if any(await asyncio.gather(*(one(n) for n in replicas))):
            return True
        try:
            return await asyncio.wait_for(asyncio.to_thread(replica_coming, self.app, self.deployments[model]),
                                          4 * PROBE_S)
        except Exception:  # noqa: BLE001 - the controller or the GCS too slow to say: nothing learnt, assume it lives
            return True

    def _watch(self) -> None:
        if self.watcher is None or self.watcher.done():
            self.watcher = asyncio.get_running_loop().create_task(self._reprobe())

    async def _reprobe(self) -> None:
        while self.down or any(t > time.monotonic() for t in self.slow.values()):
            await asyncio.sleep(REPROBE_S)
            now = time.monotonic()
            self.slow = {m: t for m, t in self.slow.items() if t > now}
            for m in {*self.down, *self.slow}:
                if not await self.live(m):
                    self.slow.pop(m, None)  # down says more


def replica_coming(app: str, deployment: str) -> bool:
    """Whether Serve's controller knows a replica of ``deployment`` (of app ``app``) placed on a node that is alive —
    the GCS says so and its raylet takes a connection within ``PROBE_S``: one that is running (however busy),
    starting (its constructor running in a worker process: ``constructed_on``), or lost on a live node and about to
    be replaced. A replica waiting for room (not placed) or on a node that is gone does not count. Blocking: called
    in a thread."""
    import socket

    import ray

    found = app_deployments(app).get(deployment) or {}
    replicas = [r for r in found.get("replicas") or [] if r.get("state") not in ("STOPPING", "STOPPED")]
    placed = {r.get("node_id") for r in replicas if r.get("node_id")}
    if any(not r.get("node_id") for r in replicas):  # Serve learns a replica's node only once its constructor is done
        constructing = constructed_on(app, deployment)
        if not constructing and has_room(found):
            return True  # a replica starting where the cluster has room for it: its worker process is on its way
        placed |= constructing
    if not placed:
        return False
    for node in ray.nodes():
        if node["NodeID"] not in placed or not node.get("Alive"):
            continue
        try:
            with socket.create_connection((node["NodeManagerAddress"], int(node["NodeManagerPort"])), PROBE_S):
                return True
        except OSError:  # refused (its raylet gone) or no answer (the machine gone)
            continue
    return False


def constructed_on(app: str, deployment: str) -> set:
    """The nodes where a worker process hosts a replica of ``deployment`` whose node Serve does not know yet: its
    constructor running (a vLLM engine loading for minutes). Serve's replica actor is created at once (pending
    creation with a process of its own, then alive within a second) and runs the deployment's constructor after;
    one that waits for room has no process. From the GCS's actor table; empty where it cannot be read."""
    try:
        from ray._private.state import state

        table = {**state.actor_table(None, job_id=None, actor_state_name="PENDING_CREATION"),
                 **state.actor_table(None, job_id=None, actor_state_name="ALIVE")}
    except Exception:  # noqa: BLE001 - the GCS too slow or this process not connected: nothing learnt
        return set()
    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    return {(a.get("Address") or {}).get("NodeID") for a in table.values()
            if str(a.get("Name") or "").startswith(prefix) and a.get("Pid") and (a.get("Address") or {}).get("NodeID")}


def has_room(deployment: dict) -> bool:
    """Whether the cluster's free resources (the GCS's view) hold one more replica of ``deployment`` (Serve's details
    of it: its ``ray_actor_options``)."""
    import ray

    opts = (deployment.get("deployment_config") or {}).get("ray_actor_options") or {}
    need = {"CPU": opts.get("num_cpus") or 0, "GPU": opts.get("num_gpus") or 0, **(opts.get("resources") or {})}
    if opts.get("accelerator_type"):
        need[f"accelerator_type:{opts['accelerator_type']}"] = 0.001
    free = ray.available_resources()
    return all(free.get(k, 0.0) >= v for k, v in need.items() if v)


class WatchedStream:
    """A deployment's stream (``DeploymentResponseGenerator``) without its heartbeats, that gives up on a model that
    does not take the request or goes silent (see the module's docstring); ``cancel()`` as the stream has it."""

    def __init__(self, gen, model: str, liveness: Liveness, patient: bool):
        self.gen, self.model, self.liveness, self.patient = gen, model, liveness, patient
        self.taken = False
        self.pending = None
        self.replica = None  # the deployment replica that took the request, once it says

    def __aiter__(self):
        return self

    async def __anext__(self):
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        failover_s = self.liveness.failover_s
        while True:
            if self.pending is None:
                self.pending = asyncio.ensure_future(self.gen.__anext__())
            done, _ = await asyncio.wait({self.pending}, timeout=failover_s)
            if not done:
                if self.taken:
                    self.liveness.suspect(self.model, f"went silent for {failover_s} s")
                    raise ReplicaLost(f"model {self.model!r} went silent for {failover_s} s (its replica lost)")
                if not self.patient:
                    self.liveness.suspect(self.model, f"did not take a request within {failover_s} s")
                    raise ReplicaLost(f"model {self.model!r} did not take the request within {failover_s} s")
                if not await self.liveness.live(self.model):
                    raise self.liveness.unavailable(self.model) or ModelUnavailable(self.model, "none answered a probe")
                continue  # a live replica that is busy or starting: the request waits for it
            task, self.pending = self.pending, None
            try:
                obj = task.result()
            except (ActorDiedError, ActorUnavailableError, RayActorError) as e:
                self.liveness.suspect(self.model, f"lost a replica ({type(e).__name__})", slow=False)
                raise
            self.taken = True  # its first object, answer or beat: a replica has the request
            if is_beat(obj):
                self.replica = obj.get("replica", self.replica)  # the first beat names the replica
                continue
            return obj

    def cancel(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
        self.gen.cancel()


class Unavailable:
    """The stream of a model known down: raises its ``ModelUnavailable`` at once."""

    def __init__(self, e: ModelUnavailable):
        self.e = e

    def __aiter__(self):
        return self

    async def __anext__(self):
        raise self.e

    def cancel(self) -> None:
        pass
