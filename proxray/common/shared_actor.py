"""State every ingress replica of an app shares (conversations, API keys' ledger, answers for feedback): one named,
detached actor per app in namespace ``proxray`` (``proxray.common.actors``), created by the first replica that needs
it and found by the rest.

Such an actor may die (a node lost, an operator's ``ray kill``, a crash). Ray restarts one that crashed
(``max_restarts``); one that was killed is created anew by the next call that finds it gone. Every call has a
timeout, and a call that fails drops the replica's handle so that the next finds the actor anew: a replica never
waits on a dead actor nor keeps a handle to one. What a dead actor means for a request is each caller's stated choice
(``SharedStateDown``): the keys ledger fails closed (a named 503, briefly), the conversation and answer books fail
open. An actor whose state matters keeps a checkpoint in the cluster's key-value store (``Checkpointed``) and starts
from it."""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

from proxray.common.actors import CALL_TIMEOUT_S, NAMESPACE, ActorDown, acall, find, get_or_create

logger = logging.getLogger("ray.serve")
CHECKPOINT_EVERY_S = 1.0
START_TIMEOUT_S = 10.0  # a call that found no handle may have started the actor: its worker's start and imports
SharedStateDown = ActorDown  # what a caller catches: the actor did not answer (``name``, ``why``)


PLACEMENT: dict = {}  # Ray resources the shared actors this process creates ask a sliver of (``place_with``)
SLIVER = 0.001


def place_with(resources: dict | None) -> None:
    """The app's shared actors this process creates go only to nodes that have ``resources`` (the ingress's
    ``router_resources``; a sliver of each, so they never crowd it out): where an ingress can run, never on a head
    node that has none of them, as the shipped cluster configs lay it out. None or empty: anywhere."""
    PLACEMENT.clear()
    PLACEMENT.update({name: SLIVER for name in resources or {}})


def app_actor(cls, name: str, *args):
    """The app's actor of ``cls`` named ``name`` (created with ``args`` where it does not exist yet; no CPU reserved).

    Its calls run one at a time but out of order: every replica calls it fire-and-forget, and with Ray's in-order
    queue one call that never arrives (a lost push under load) holds every later call for 30 s and then cancels them
    all. Nothing here depends on the order of two calls in flight at once (each is a whole update or a lookup).

    It is created on the caller's node where that node can take it (softly: elsewhere if not), and only where the
    resources ``place_with`` named are (the ingress's): an ingress replica's node, off the head, so a head lost does
    not take the app's state with it — calls between two workers' processes need no GCS and go on while the head is
    restarted — and one lost with its node is started again where an ingress can run."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    placed = {"resources": dict(PLACEMENT)} if PLACEMENT else {}
    return get_or_create(cls, name, *args, num_cpus=0, allow_out_of_order_execution=True, max_restarts=-1,
                         scheduling_strategy=here, **placed)


class SharedActorClient:
    """A replica's side of one named actor: ``actor_cls`` named ``<prefix>-<app>``, created (with ``actor_args()``)
    or found on first use, and found again after it died. ``creates = False``: an actor someone else starts (the
    drift monitor), only looked up — at most every ``retry_s`` while it is absent."""

    actor_cls: type = object
    prefix = "proxray-shared"
    creates = True
    retry_s = 2.0

    batch_s = 0.05  # what ``later`` sends waits at most this long for others to go with it

    def __init__(self, app_name: str, spec=None, name: str | None = None):
        self.name, self.spec, self._handle = name or f"{self.prefix}-{app_name}", spec, None
        self._next_lookup = 0.0
        self.background: set = set()  # fire-and-forget calls in flight (kept until done)
        self._queued, self._batcher = [], None  # ``later``'s calls not sent yet, and the task that sends them

    def actor_args(self) -> tuple:
        return ()

    def _actor(self):
        if self._handle is None and not self.creates:
            now = time.monotonic()
            handle = find(self.name) if now >= self._next_lookup else None
            if handle is None:
                if now >= self._next_lookup:
                    self._next_lookup = now + self.retry_s
                raise ActorDown(self.name, "not running")
            self._handle = handle
        elif self._handle is None:
            self._handle = app_actor(self.actor_cls, self.name, *self.actor_args())
            if hasattr(self.actor_cls, "configure"):  # an actor found, not created, learns this app's settings
                self._handle.configure.remote(*self.actor_args())
        return self._handle

    def lost(self) -> None:
        """Drop the handle: the next call finds (or creates) the actor anew."""
        self._handle = None
        self._next_lookup = time.monotonic() + (0.0 if self.creates else self.retry_s)

    async def call(self, method: str, *args, timeout_s: float = CALL_TIMEOUT_S):
        """The actor's ``method(*args)``; ``SharedStateDown`` where it died, is restarting or took longer than
        ``timeout_s`` (the handle is dropped: the next call finds or creates the actor anew). A call that had no handle
        may have created the actor: it waits up to ``START_TIMEOUT_S`` for the new actor's first answer (a worker
        started and the state restored from its checkpoint take seconds on a loaded node), not a running one's 2 s."""
        if self._handle is None and self.creates:
            timeout_s = max(timeout_s, START_TIMEOUT_S)
        try:
            actor = self._actor()
        except ValueError:  # the name is being released or taken again while the actor is replaced
            self.lost()
            raise ActorDown(self.name, "being replaced") from None
        try:
            return await acall(actor, self.name, method, *args, timeout_s=timeout_s)
        except ActorDown:
            self.lost()
            raise

    def send(self, method: str, *args) -> bool:
        """``method(*args)`` sent without waiting for, nor keeping, its result (a report that may be dropped): False
        where the actor is not there."""
        try:
            getattr(self._actor(), method).remote(*args)
            return True
        except ActorDown:
            return False
        except Exception as e:  # noqa: BLE001 - a dead handle: look it up again later
            logger.warning("proxray: %s unavailable (%s); looking it up again", self.name, type(e).__name__)
            self.lost()
            return False

    def tell(self, method: str, *args) -> None:
        """``method(*args)`` without waiting for it (from the event loop): a failure is logged, never raised."""
        async def send():
            try:
                await self.call(method, *args)
            except SharedStateDown as e:
                logger.warning("proxray: %s.%s not recorded: %s", self.name, method, e.why)

        task = asyncio.get_running_loop().create_task(send())
        self.background.add(task)
        task.add_done_callback(self.background.discard)


    def later(self, method: str, *args) -> None:
        """``method(*args)`` without waiting for it (from the event loop), sent with every other ``later`` call of the
        next ``batch_s`` in one actor call (``Batched.many``): a busy replica's fire-and-forget writes cost one call
        a batch, not one each. A failure is logged, never raised."""
        self._queued.append((method, args))
        if self._batcher is None:
            self._batcher = asyncio.get_running_loop().create_task(self._send_later())
            self.background.add(self._batcher)
            self._batcher.add_done_callback(self.background.discard)

    async def _send_later(self) -> None:
        await asyncio.sleep(self.batch_s)
        calls, self._queued, self._batcher = self._queued, [], None  # what comes from now on goes in the next batch
        try:
            await self.call("many", calls)
        except SharedStateDown as e:
            logger.warning("proxray: %s: %d calls not recorded: %s", self.name, len(calls), e.why)


class Batched:
    """Mixed into a shared actor that takes ``SharedActorClient.later``'s batches."""

    def many(self, calls: list) -> None:
        for method, args in calls:
            getattr(self, method)(*args)


class Checkpointed:
    """Mixed into a shared actor whose state must outlive it: ``_restore()`` in its constructor reads the last
    checkpoint from the cluster's key-value store (kept by the GCS — in its Redis where the cluster has GCS fault
    tolerance — so it survives the actor), ``_dirty()`` after a change takes one at most every ``CHECKPOINT_EVERY_S``
    (the actor's ``_state()`` as JSON, in the actor's thread) and hands it to a writer thread. The actor never waits on
    the store: while the GCS is down (a head node restarting) its calls go on answering from memory, and the writer
    keeps the newest checkpoint until the store takes it."""

    checkpoint_key = ""

    def _checkpoints_start(self) -> None:
        """No checkpoint taken yet, no writer running (what ``_restore`` starts with)."""
        self._saved_at, self._pending, self._writer, self._wake = 0.0, None, None, threading.Event()
        self._handover = threading.Lock()  # the newest state, between the actor's thread and the writer

    def _restore(self) -> None:
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

        self._checkpoints_start()
        if self.checkpoint_key and _internal_kv_initialized():
            raw = _internal_kv_get(self.checkpoint_key, namespace=NAMESPACE)
            if raw:
                self._load(json.loads(raw))

    def _dirty(self, force: bool = False) -> None:
        """A change was made: a checkpoint taken now when the last is ``CHECKPOINT_EVERY_S`` old, else with a later
        change (an actor in use loses at most its last second of changes with it)."""
        now = time.monotonic()
        if not self.checkpoint_key or (not force and now - self._saved_at < CHECKPOINT_EVERY_S):
            return
        state = json.dumps(self._state())
        with self._handover:
            self._saved_at, self._pending = now, state
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_checkpoints, name="proxray-checkpoint", daemon=True)
            self._writer.start()
        self._wake.set()

    def _write_checkpoints(self) -> None:
        from ray.experimental.internal_kv import _internal_kv_initialized, _internal_kv_put

        failing = False
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._handover:
                state, self._pending = self._pending, None
            if state is None or not _internal_kv_initialized():
                continue
            try:
                _internal_kv_put(self.checkpoint_key, state, overwrite=True, namespace=NAMESPACE)
                if failing:
                    logger.warning("proxray: %s checkpointed again", self.checkpoint_key)
                failing = False
            except Exception as e:  # noqa: BLE001 - the GCS away: keep the newest state, try again in a second
                if not failing:
                    logger.warning("proxray: %s not checkpointed (%s); trying again", self.checkpoint_key,
                                   type(e).__name__)
                failing = True
                with self._handover:
                    if self._pending is None:  # nothing newer came meanwhile
                        self._pending = state
                time.sleep(CHECKPOINT_EVERY_S)
                self._wake.set()
