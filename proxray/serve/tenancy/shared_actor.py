"""State every ingress replica of an app shares (conversations, API keys' ledger, answers for feedback): one named,
detached actor per app in namespace ``proxray``, created by the first replica that needs it and found by the rest.

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
import time

logger = logging.getLogger("ray.serve")
CALL_TIMEOUT_S = 2.0  # a shared actor that has not answered by then is taken as down for this call
CHECKPOINT_EVERY_S = 1.0


class SharedStateDown(Exception):
    """A shared actor did not answer (dead, restarting, or too slow): ``name`` and why."""

    def __init__(self, name: str, why: str):
        super().__init__(f"{name}: {why}")
        self.name, self.why = name, why


def app_actor(cls, name: str, *args):
    """The app's actor of ``cls`` named ``name`` (created with ``args`` where it does not exist yet; no CPU reserved).

    Its calls run one at a time but out of order: every replica calls it fire-and-forget, and with Ray's in-order
    queue one call that never arrives (a lost push under load) holds every later call for 30 s and then cancels them
    all. Nothing here depends on the order of two calls in flight at once (each is a whole update or a lookup)."""
    import ray

    return ray.remote(cls).options(name=name, namespace="proxray", get_if_exists=True, lifetime="detached",
                                   num_cpus=0, allow_out_of_order_execution=True, max_restarts=-1).remote(*args)


class SharedActorClient:
    """An ingress replica's side of one of the app's shared actors: ``actor_cls`` named ``<prefix>-<app>``, created
    (with ``actor_args()``) or found on first use, and found again after it died."""

    actor_cls: type = object
    prefix = "proxray-shared"

    def __init__(self, app_name: str, spec=None):
        self.name, self.spec, self._handle = f"{self.prefix}-{app_name}", spec, None
        self.background: set = set()  # fire-and-forget calls in flight (kept until done)

    def actor_args(self) -> tuple:
        return ()

    def _actor(self):
        if self._handle is None:
            self._handle = app_actor(self.actor_cls, self.name, *self.actor_args())
            if hasattr(self.actor_cls, "configure"):  # an actor found, not created, learns this app's settings
                self._handle.configure.remote(*self.actor_args())
        return self._handle

    async def call(self, method: str, *args, timeout_s: float = CALL_TIMEOUT_S):
        """The actor's ``method(*args)``; ``SharedStateDown`` where it died, is restarting or took longer than
        ``timeout_s`` (the handle is dropped: the next call finds or creates the actor anew)."""
        import ray

        try:
            return await asyncio.wait_for(getattr(self._actor(), method).remote(*args), timeout_s)
        except asyncio.TimeoutError:
            self._handle = None
            raise SharedStateDown(self.name, f"no answer within {timeout_s:g} s") from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ValueError) as e:
            # ValueError: the name is being released or taken again while the actor is replaced
            self._handle = None
            raise SharedStateDown(self.name, type(e).__name__) from None

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


class Checkpointed:
    """Mixed into a shared actor whose state must outlive it: ``_restore()`` in its constructor reads the last
    checkpoint from the cluster's key-value store (kept by the GCS, so it survives the actor), ``_dirty()`` after a
    change writes one at most every ``CHECKPOINT_EVERY_S`` (the actor's ``_state()`` / ``_load(state)`` as JSON)."""

    checkpoint_key = ""

    def _restore(self) -> None:
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

        self._saved_at = 0.0
        if self.checkpoint_key and _internal_kv_initialized():
            raw = _internal_kv_get(self.checkpoint_key, namespace="proxray")
            if raw:
                self._load(json.loads(raw))

    def _dirty(self, force: bool = False) -> None:
        """A change was made: written now when the last checkpoint is ``CHECKPOINT_EVERY_S`` old, else with a
        later change (an actor in use loses at most its last second of changes with it)."""
        now = time.monotonic()
        if not self.checkpoint_key or (not force and now - self._saved_at < CHECKPOINT_EVERY_S):
            return
        from ray.experimental.internal_kv import _internal_kv_initialized, _internal_kv_put

        if _internal_kv_initialized():
            _internal_kv_put(self.checkpoint_key, json.dumps(self._state()), overwrite=True, namespace="proxray")
            self._saved_at = now
