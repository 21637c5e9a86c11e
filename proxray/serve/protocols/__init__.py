"""The client protocols the gateway speaks, one row each (``base.Protocol``), and the table that drives the ingress
and its HTTP app: ``{route: protocol}``. Each protocol is a module (or a folder) of its own: its request model, its
turn (the translation to and from the one internal request, ``core``), its stream format and error shape.

Adding a protocol: write its module (a request model, a ``Turn`` subclass with ``begin``, a stream format, a
``has_content`` test, a ``Protocol`` row) and add the row below; nothing else names it. Pool models whose endpoints
serve it themselves list its name in ``protocols`` (``proxray.pool.spec.PROTOCOLS`` holds the names a config may
write)."""
from __future__ import annotations

from proxray.serve.protocols.base import Protocol
from proxray.serve.protocols.chat import CHAT, COMPLETIONS
from proxray.serve.protocols.messages.protocol import MESSAGES
from proxray.serve.protocols.responses.protocol import RESPONSES

PROTOCOLS: dict[str, Protocol] = {p.route: p for p in (CHAT, COMPLETIONS, RESPONSES, MESSAGES)}
