"""Whether the app can answer every model it serves yet: ``GET /health``'s answer while an app starts.

An ingress replica answers HTTP as soon as it is up, which can be well before a model deployment beside it is: a vLLM
engine imports and loads its weights for a minute or more on a CPU after the ingress answers. A load balancer, a
readiness probe or a script that waits for ``/health`` would send the first requests to an app that cannot answer
them. So ``/health`` says 503 (``starting``, with the models still starting and a Retry-After) until every model
deployment of the app has had a running replica — Serve's controller's own view — and 200 from then on: a model lost
later (a node gone) is the liveness check's business (``liveness.py``: routed around, a request naming it a 503), not
a reason to take the whole gateway out of a load balancer.
"""
from __future__ import annotations

import asyncio
import time

ASK_EVERY_S = 1.0  # how often, at most, a replica asks the controller while the app starts
ASK_TIMEOUT_S = 2.0  # a controller that does not answer in this long: the models count as still starting


class Readiness:
    """This ingress replica's view of which of the app's model deployments (``deployments``: model id -> deployment
    name) have not had a running replica yet; once none is left it stays ready without asking again."""

    def __init__(self, app: str | None, deployments: dict):
        self.app, self.deployments = app, dict(deployments)
        self.left = sorted(self.deployments) if app is not None else []
        self.asked_at = float("-inf")

    async def starting(self) -> list:
        """The models still starting (empty once every one has had a running replica)."""
        if not self.left:
            return []
        now = time.monotonic()
        if now - self.asked_at >= ASK_EVERY_S:
            self.asked_at = now
            try:
                running = await asyncio.wait_for(asyncio.to_thread(running_replicas, self.app), ASK_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the controller busy or away: nothing learnt, still starting
                return list(self.left)
            self.left = [m for m in self.left if running.get(self.deployments[m], 0) == 0]
        return list(self.left)

    async def health(self):
        """``GET /health``'s answer: 200 once every model the app serves has had a running replica; before that 503
        with how many are still starting (not which: /health asks for no key) and a Retry-After."""
        starting = await self.starting()
        if starting:
            from fastapi.responses import JSONResponse

            return JSONResponse({"status": "starting", "models_starting": len(starting)}, status_code=503,
                                headers={"Retry-After": "1"})
        return {"status": "ok"}


def app_deployments(app: str) -> dict:
    """{deployment name: Serve's details of it} of Serve app ``app``, as the controller knows them. Blocking."""
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()
    return ((details.get("applications") or {}).get(app) or {}).get("deployments") or {}


def running_replicas(app: str) -> dict:
    """{deployment name: its replicas in state RUNNING} of Serve app ``app``, as the controller knows them. Blocking."""
    return {name: sum(r.get("state") == "RUNNING" for r in d.get("replicas") or [])
            for name, d in app_deployments(app).items()}
