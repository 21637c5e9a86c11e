"""The fates a request's field can have on its way to a model, and the row each protocol's table declares per field
(``responses.fields``, ``messages.fields``): at a model that serves the protocol itself (``native``: relayed) and at
one that answers through chat completions (``chat``). Only a field that would change the answer and cannot be honoured
is refused; a hint with no effect on the answer's meaning is dropped and named in the answer (the report's
``dropped``, the header ``x-proxray-dropped``); a field asking for something the model does not produce is answered as
empty. The HTTP reference's support matrices are written from the tables (``docs/generate.py``), and
``tests/test_fields.py`` checks each table against its translator."""
from __future__ import annotations

from dataclasses import dataclass

PASSED, TRANSLATED, GATEWAY, EMPTY, DROPPED, REFUSED = ("passed", "translated", "gateway", "empty", "dropped",
                                                        "refused")
FATES = {
    PASSED: "sent on as it is (a chat model that cannot honour it refuses it by name: routing passes it over)",
    TRANSLATED: "sent in chat's words",
    GATEWAY: "honoured by the gateway itself, not sent on",
    EMPTY: "asks for something the model does not produce: answered faithfully with none of it",
    DROPPED: "a hint with no effect on the answer's meaning: not sent on, named in the answer's `dropped`",
    REFUSED: "would change the answer and cannot be honoured: a 400 naming it for that model (routing passes it over)",
}


@dataclass(frozen=True)
class Fate:
    field: str  # a field, a field's part (``reasoning.summary``) or a kind of value (``tools[type=web_search]``)
    native: str
    chat: str
    how: str  # at a chat model: what it becomes, or why


def chat_fates(table: tuple) -> dict:
    """``{top-level field: its fate at a chat model}`` of ``table`` (``any other field``'s row under that name), built
    once per protocol: a request's fields are looked up in it."""
    return {f.field: f.chat for f in table if "[" not in f.field and "." not in f.field}


def chat_fate(fates: dict, name: str) -> str:
    """A top-level field's fate at a chat model, from its protocol's ``chat_fates`` (``any other field``'s where it
    names none)."""
    return fates.get(name) or fates["any other field"]
