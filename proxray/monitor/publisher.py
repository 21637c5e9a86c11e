"""The router the monitor grows, and how a new version reaches the serving replicas: every change is saved as
a new artifact (``state_dir/routers/vNNNN``), which the ingress replicas watch for and switch to. Every version is
kept with what made it (``versions``): the one served, those it replaced, those rolled back; ``rollback`` serves an
earlier one again — the replicas switch to it as to a new one, between requests."""
from __future__ import annotations

import time

from proxray.common.storage import join


class RouterPublisher:
    def __init__(self, path: str, folder):
        from proxray.routing.registry import load_router

        self.folder = str(folder)  # a local folder or a URI
        self.path, self.version = path, 0  # the served router, and the number of the last version published
        self.router = load_router(path)
        self.versions = [{"version": 0, "path": path, "status": "served", "at": time.time(), "why": {"initial": True}}]

    @property
    def served(self) -> int:
        return next(v["version"] for v in self.versions if v["status"] == "served")

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

    def save(self, router, status: str, **why) -> tuple[int, str]:
        """Save ``router`` as the next version with ``status`` (served, candidate, rejected); (its number, its path).
        ``why``: what made it (and the gate's figures)."""
        self.version += 1
        path = join(self.folder, f"v{self.version:04d}")
        router.save(path)
        gate = why.pop("gate", None)
        self.versions.append({"version": self.version, "path": path, "status": status, "at": time.time(),
                              "why": why, "n_train": int(router.n_train_), "parent": self.served,
                              **({"gate": gate} if gate else {})})
        if status == "served":
            self._serve(self.versions[-1], router)
        return self.version, path

    def publish(self, router, **why) -> str:
        """Save ``router`` as the next version and serve it; returns its path."""
        return self.save(router, "served", **why)[1]

    def promote(self, version: int, router=None, **why) -> None:
        """Serve candidate ``version`` (``router``: it, loaded; else loaded from its path)."""
        from proxray.routing.registry import load_router

        v = self.get(version)
        router = router if router is not None else load_router(v["path"])
        v.setdefault("gate", {}).update(why)
        self._serve(v, router)

    def reject(self, version: int, **why) -> None:
        """Mark ``version`` rejected, kept with why (and its figures)."""
        v = self.get(version)
        v["status"] = "rejected"
        v.setdefault("gate", {}).update(why)

    def get(self, version: int) -> dict:
        return next(v for v in self.versions if v["version"] == version)

    def _serve(self, record: dict, router) -> None:
        for v in self.versions:
            if v["status"] == "served" and v is not record:
                v["status"] = "replaced"
        record["status"] = "served"
        self.router, self.path = router, record["path"]

    def rollback(self, to: int | None = None) -> dict:
        """Serve version ``to`` again (default: the last one the served version replaced); the served one is marked
        rolled back. Returns ``{"from", "to", "path"}``; a ``ValueError`` names what cannot be rolled back to."""
        from proxray.routing.registry import load_router

        current = self.served
        if to is None:
            earlier = [v for v in self.versions if v["version"] < current and v["status"] == "replaced"]
            if not earlier:
                raise ValueError(f"version {current} replaced no version that could be served again")
            target = earlier[-1]
        else:
            target = next((v for v in self.versions if v["version"] == to), None)
            if target is None or to == current or target["status"] in ("candidate", "rejected"):
                known = [v["version"] for v in self.versions]
                raise ValueError(f"--to {to}: not a version that served, other than the served one ({current}); "
                                 f"versions: {known}")
        router = load_router(target["path"])  # before anything changes: an unreadable artifact changes nothing
        for v in self.versions:
            if v["version"] == current:
                v["status"] = "rolled_back"
        target["status"] = "served"
        self.router, self.path = router, target["path"]
        return {"from": current, "to": target["version"], "path": target["path"]}

    def state(self) -> dict:
        """What a snapshot keeps of it: the last version published, where the served one is, every version."""
        return {"version": self.version, "router_path": self.path, "versions": self.versions}

    def restore(self, snap: dict) -> None:
        from proxray.routing.registry import load_router

        self.version = snap["version"]
        if snap.get("versions"):
            self.versions = snap["versions"]
        elif snap["router_path"] != self.path:  # a state written before versions were kept: the served one known
            self.versions[0]["status"] = "replaced"
            self.versions.append({"version": snap["version"], "path": snap["router_path"], "status": "served",
                                  "at": None, "why": {"restored": True}})
        if snap["router_path"] != self.path:
            self.path, self.router = snap["router_path"], load_router(snap["router_path"])
