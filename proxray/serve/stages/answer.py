"""The answer in the client's protocol, or its stream, with the ``proxray`` report and its headers; its usage given
to every count (at once for a whole answer, at the stream's end for a stream)."""
from fastapi.responses import JSONResponse, StreamingResponse

from proxray.common.pricing import Usage
from proxray.serve.request.http import response_headers
from proxray.serve.request.sse import answer_stream
from proxray.serve.tenancy.conversations import billed


async def respond(f, counts: list, gw):
    turn, report, head = f.turn, f.plan.report, f.head
    relayed = gw.client.relayed(f.model)
    # a hosted provider's prompt cache is shared by every key of the gateway: a key is not shown its cache reads or
    # writes (another key's prefix would be a hit, or a write's absence, it could see); co-hosted models keep each
    # key's apart (cache_salt)
    view = Usage.without_cache_detail if f.key is not None and relayed else None
    if view is None and not f.req.stream:  # a whole answer's report: what its cache reads were billed
        billed(report, turn.usage(head[0]))
    if f.req.stream:
        events = await answer_stream(turn, head, f.gen, report, counts, lambda: gw.metrics.error(502),
                                     read_on_until=f.deadline if relayed else None, view=view)
        return StreamingResponse(events, media_type="text/event-stream", headers=response_headers(report))
    done = getattr(f.gen, "done", None)  # an endpoint relayed from here: its slot given back with the answer
    if done is not None:
        await done()
    for count in counts:
        count(turn.usage(head[0]))
    shown = view(head[0]) if view is not None else head[0]
    return JSONResponse(await turn.answer(shown, report), headers=response_headers(report))
