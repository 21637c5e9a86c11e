"""proxray's named Ray actors, found and called one way: every one lives in namespace ``NAMESPACE``, detached, created
by whoever needs it first (``get_or_create``) or only looked up (``find``), and every call has a timeout
(``call`` from a thread, ``acall`` from an event loop) and raises ``ActorDown`` — naming the actor and why — where the
actor is gone, restarting or too slow. The app's shared state (keys ledger, books, response store, limiter,
``proxray.common.shared_actor``), the ingress's monitor client, the monitor's Serve keeper and the CLI all go
through here; Ray is imported only when an actor is used."""
from __future__ import annotations

import asyncio

NAMESPACE = "proxray"  # every named actor proxray creates, and its key-value checkpoints
CALL_TIMEOUT_S = 2.0  # a shared actor of the app that has not answered by then is taken as down for this call


class ActorDown(Exception):
    """A named actor did not answer (absent, dead, restarting, or too slow): ``name`` and why."""

    def __init__(self, name: str, why: str):
        super().__init__(f"{name}: {why}")
        self.name, self.why = name, why


def get_or_create(cls, name: str, *args, **options):
    """The detached actor of ``cls`` named ``name`` in ``NAMESPACE``, created with ``args`` and Ray ``options`` where
    it does not exist yet, else the one that runs (its constructor's arguments are then ignored)."""
    import ray

    remote = cls if hasattr(cls, "options") else ray.remote(cls)
    return remote.options(name=name, namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
                          **options).remote(*args)


def find(name: str):
    """The actor named ``name`` in ``NAMESPACE``, or None where none runs."""
    import ray

    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def _down_errors():
    import ray

    # ValueError: the name is being released or taken again while the actor is replaced
    return ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ValueError


def _task_error():
    import ray

    return ray.exceptions.RayTaskError


def call(actor, name: str, method: str, *args, timeout_s: float | None = CALL_TIMEOUT_S):
    """``actor.method(*args)`` waited on from a thread (the CLI, a Serve replica's health check); ``ActorDown``
    where the actor ``name`` died or took longer than ``timeout_s`` (None: no limit)."""
    import ray

    try:
        return ray.get(getattr(actor, method).remote(*args), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise ActorDown(name, f"no answer within {timeout_s:g} s") from None
    except _task_error():  # the method itself failed (an instance of its cause too, ValueError included): raised
        raise
    except _down_errors() as e:
        raise ActorDown(name, type(e).__name__) from None


async def acall(actor, name: str, method: str, *args, timeout_s: float = CALL_TIMEOUT_S):
    """``actor.method(*args)`` awaited on the event loop; ``ActorDown`` as for ``call``."""
    try:
        return await asyncio.wait_for(getattr(actor, method).remote(*args), timeout_s)
    except asyncio.TimeoutError:
        raise ActorDown(name, f"no answer within {timeout_s:g} s") from None
    except _task_error():
        raise
    except _down_errors() as e:
        raise ActorDown(name, type(e).__name__) from None
