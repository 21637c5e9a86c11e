"""The model-listing routes, ``GET /v1/models`` and ``GET /v1/models/{model}`` (the openai SDK's ``models.list`` and
``models.retrieve``): the router first, then every served model — for a key with ``allowed_models``, only those it
may use. The ingress's HTTP app binds them (``http.gateway_api``)."""
from __future__ import annotations

import time

from fastapi import Request

from proxray.serve.config import ROUTER_MODEL
from proxray.serve.errors import RequestError
from proxray.serve.request import plan as planning
from proxray.serve.request.http import error_response


class ModelList:
    def __init__(self, gate, routable: list, handles: dict, kinds: dict):
        self.gate, self.routable, self.handles, self.kinds = gate, routable, handles, kinds
        self.created = int(time.time())  # the model objects' "created"

    def objects(self, key=None) -> list:
        """OpenAI model objects a key may see."""
        def mine(model):
            return self.gate.rules.may_use(key, model)

        data = [{"id": ROUTER_MODEL, "object": "model", "created": self.created, "owned_by": "proxray",
                 "routes_to": [m for m in self.routable if mine(m)]}]
        return data + [{"id": m, "object": "model", "created": self.created, "owned_by": "proxray",
                        "engine": self.kinds[m]} for m in sorted(self.handles) if mine(m)]

    async def list(self, request: Request):
        try:
            key = self.gate.identify(request)
        except RequestError as e:
            return error_response(e)
        return {"object": "list", "data": self.objects(key)}

    async def get(self, model: str, request: Request):
        try:
            key = self.gate.identify(request)
            mine = self.objects(key)
            found = [m for m in mine if m["id"] == model]
            if not found:
                raise planning.not_served(model, [m["id"] for m in mine[1:]])
        except RequestError as e:
            return error_response(e)
        return found[0]
