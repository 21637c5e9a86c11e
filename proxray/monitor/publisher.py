"""The router the monitor grows, and how a new version reaches the serving replicas: every change is saved as
a new artifact (``state_dir/routers/vNNNN``), which the ingress replicas watch for and switch to."""
from __future__ import annotations

from proxray.common.storage import join


class RouterPublisher:
    def __init__(self, path: str, folder):
        from proxray.routing.registry import load_router

        self.folder = str(folder)  # a local folder or a URI
        self.path, self.version = path, 0
        self.router = load_router(path)

    @property
    def models(self) -> list:
        return list(self.router.models_)

    def fresh(self):
        """The current version, loaded anew (to be changed and published, the served one left as it is)."""
        from proxray.routing.registry import load_router

        return load_router(self.path)

    def with_queries(self, X, acc, cost, query_ids=None, tasks=None):
        """The current router, loaded anew, with labelled queries added (``add_queries``: no refit)."""
        router = self.fresh()
        return router.add_queries(X, acc, cost if router.has_cost_ else None, query_ids=query_ids, tasks=tasks)

    def with_models(self, parts, order: list, models: list):
        """The current router, loaded anew, with a column per new model (``add_model``) from an evaluation's rows
        ``parts`` over the training queries, whose ids are ``order`` (the router's training order)."""
        router = self.fresh()
        parts = parts.drop_duplicates(["model", "query_id"], keep="last")
        for m in models:
            col = parts[parts["model"] == m].set_index("query_id")
            if not set(order) <= set(col.index):
                raise ValueError(f"the growth evaluation has {len(col)} of {len(order)} training queries for {m!r}")
            router.add_model(m, col.loc[order, "correct"].to_numpy(float),
                             col.loc[order, "cost"].to_numpy(float) if router.has_cost_ else None)
        return router

    def publish(self, router) -> str:
        """Save ``router`` as the next version; returns its path."""
        self.version += 1
        path = join(self.folder, f"v{self.version:04d}")
        router.save(path)
        self.router, self.path = router, path
        return self.path

    def state(self) -> dict:
        """What a snapshot keeps of it: the version published last and where it is."""
        return {"version": self.version, "router_path": self.path}

    def restore(self, snap: dict) -> None:
        from proxray.routing.registry import load_router

        self.version = snap["version"]
        if snap["router_path"] != self.path:
            self.path, self.router = snap["router_path"], load_router(snap["router_path"])
