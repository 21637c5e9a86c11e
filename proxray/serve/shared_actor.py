"""State every ingress replica of an app shares (conversations, API keys' ledger, answers for feedback): one named,
detached actor per app in namespace ``proxray``, created by the first replica that needs it and found by the rest."""
from __future__ import annotations


def app_actor(cls, name: str, *args):
    """The app's actor of ``cls`` named ``name`` (created with ``args`` where it does not exist yet; no CPU reserved).

    Its calls run one at a time but out of order: every replica calls it fire-and-forget, and with Ray's in-order
    queue one call that never arrives (a lost push under load) holds every later call for 30 s and then cancels them
    all. Nothing here depends on the order of two calls in flight at once (each is a whole update or a lookup)."""
    import ray

    return ray.remote(cls).options(name=name, namespace="proxray", get_if_exists=True, lifetime="detached",
                                   num_cpus=0, allow_out_of_order_execution=True).remote(*args)


class SharedActorClient:
    """An ingress replica's side of one of the app's shared actors: ``actor_cls`` named ``<prefix>-<app>``, created
    (with ``actor_args()``) or found on first use."""

    actor_cls: type = object
    prefix = "proxray-shared"

    def __init__(self, app_name: str, spec=None):
        self.name, self.spec, self._handle = f"{self.prefix}-{app_name}", spec, None

    def actor_args(self) -> tuple:
        return ()

    def _actor(self):
        if self._handle is None:
            self._handle = app_actor(self.actor_cls, self.name, *self.actor_args())
        return self._handle
