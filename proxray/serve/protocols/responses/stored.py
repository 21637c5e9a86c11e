"""The stored-response routes: ``GET /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items`` and
``DELETE /v1/responses/{id}``, over the app's ``ResponseStore`` (``proxray.serve.tenancy.responses``); the ingress's
HTTP app binds them (the Responses protocol's routes)."""
from __future__ import annotations

from fastapi import Request

from proxray.serve.errors import RequestError
from proxray.serve.request.cache import scope_of
from proxray.serve.request.http import error_response


class StoredResponses:
    """Each route: the caller's key (its rate counted, as for feedback), then the store; errors in OpenAI's shape."""

    def __init__(self, store, gate, metrics, cache=None):
        self.store, self.gate, self.metrics, self.cache = store, gate, metrics, cache

    async def _route(self, request, act):
        """``act`` on the caller's key (its ``KeySpec``; None for the app's single key)."""
        try:
            key = self.gate.identify(request)
            await self.gate.admit(key, 0.0, None, budget=False)
            return await act(key)
        except RequestError as e:
            self.metrics.error(e.status)
            return error_response(e)

    async def get(self, response_id: str, request: Request):
        """``GET /v1/responses/{id}``: a stored response of this key."""
        return await self._route(request, lambda key: self.retrieve(response_id, key, request.query_params))

    async def items(self, response_id: str, request: Request):
        """``GET /v1/responses/{id}/input_items``: a page of a stored response's own input items."""
        return await self._route(request, lambda key: self.input_items(response_id, key, request.query_params))

    async def remove(self, response_id: str, request: Request):
        """``DELETE /v1/responses/{id}``."""
        return await self._route(request, lambda key: self.delete(response_id, key))

    async def retrieve(self, rid: str, key, query) -> dict:
        """The stored response of ``key`` (its ``KeySpec``, None for the app's single key)."""
        if query.get("stream", "false").lower() in ("1", "true"):
            raise RequestError(400, "stream: a stored response is returned whole, not replayed as a stream", "stream")
        return (await self.store.get(rid, key and key.owner))["response"]

    async def input_items(self, rid: str, key, query) -> dict:
        try:
            limit = int(query.get("limit", "20"))
        except ValueError:
            raise RequestError(400, f"limit: an integer between 1 and 100 (got {query.get('limit')[:20]!r})",
                               "limit") from None
        return input_items_page(await self.store.get(rid, key and key.owner), rid, limit, query.get("order", "desc"),
                                query.get("after"))

    async def delete(self, rid: str, key) -> dict:
        """The stored response of ``key`` (its ``KeySpec``, None for the app's single key) deleted, and the response
        cache's answer that was it, where the cache kept one."""
        await self.store.delete(rid, key and key.owner)
        if self.cache is not None:
            self.cache.forget(scope_of(key), rid)
        return {"id": rid, "object": "response", "deleted": True}


def input_items_page(record: dict, rid: str, limit: int, order: str, after: str | None) -> dict:
    """``GET /v1/responses/{id}/input_items``: the response's own input items, a page of them (``limit`` 1–100,
    ``order`` asc or desc, ``after`` an item id), as OpenAI lists them; an item the client sent without an id is listed
    under one of the response's (``msg_<response>_<n>``, the same every time)."""
    if not 1 <= limit <= 100:
        raise RequestError(400, f"limit: between 1 and 100 (got {limit})", "limit")
    if order not in ("asc", "desc"):
        raise RequestError(400, f"order: asc or desc (got {order!r})", "order")
    base = rid.removeprefix("resp_")
    items = [x if x.get("id") else {"id": f"{'msg' if x.get('type') == 'message' else 'item'}_{base}_{n}", **x}
             for n, x in enumerate(record["input"])]
    items = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [x.get("id") for x in items]
        if after not in ids:
            raise RequestError(404, f"after: no input item {after[:80]!r} in this response", "after",
                               kind="not_found_error")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
