"""Tool calls on the simulated engine, so that agents (Claude Code, an openai client with tools) run on the CPU demo:
a request whose ``tool_choice`` forces a tool (``required``: the first; ``{"type": "function", ...}``: that one) is
answered with one call of it, its arguments an example of its ``parameters`` schema (every required property, with a
value of its type); with ``auto`` the model answers in text, as a model that chose no tool. A conversation's earlier
tool calls and results are read as text. No other engine of the CPU pool honours tools (they refuse them by name)."""
from __future__ import annotations

import json
import uuid

HONOURED = {"tools", "tool_choice", "parallel_tool_calls"}


def forced(body: dict) -> dict | None:
    """The function ``body`` forces a call of (its ``tools`` entry's ``function``), or None."""
    tools = [t.get("function") or {} for t in body.get("tools") or [] if t.get("type", "function") == "function"]
    choice = body.get("tool_choice")
    if not tools or choice in (None, "auto", "none"):
        return None
    if choice == "required":
        return tools[0]
    name = ((choice or {}).get("function") or {}).get("name")
    return next((t for t in tools if t.get("name") == name), None)


def example(schema: dict | None):
    """A value that fits ``schema`` (JSON Schema's common keywords): its ``default``/``enum``/``const`` first, an
    object's required properties filled."""
    schema = schema or {}
    for k in ("const", "default"):
        if k in schema:
            return schema[k]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: example(props.get(k)) for k in schema.get("required") or []}
    return {"array": [], "string": "example", "integer": 0, "number": 0, "boolean": False}.get(kind)


def readable(messages: list) -> list:
    """The conversation with tool calls and results as text (what the simulated engine reads)."""
    out = []
    for m in messages:
        if m.get("role") == "tool":
            out.append({"role": "user", "content": f"[tool result] {m.get('content') or ''}"})
            continue
        calls = m.get("tool_calls") or []
        if calls:
            said = "; ".join(f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments')})"
                             for c in calls)
            m = {**m, "content": f"{m.get('content') or ''}[called {said}]"}
            m.pop("tool_calls")
        out.append(m)
    return out


def answer(head: dict, fn: dict, body: dict):
    """The objects of an answer that calls ``fn`` (a whole completion, or its chunks)."""
    args = json.dumps(example(fn.get("parameters")))
    call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": fn.get("name"), "arguments": args}}
    chars = len(json.dumps(body.get("messages"))) + len(json.dumps(body.get("tools")))
    usage = {"prompt_tokens": chars // 4 + 1, "completion_tokens": len(args) // 4 + 1}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    if not body.get("stream"):
        return [{**head, "object": "chat.completion", "usage": usage,
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                              "finish_reason": "tool_calls", "logprobs": None}]}]
    start = {**call, "index": 0, "function": {"name": fn.get("name"), "arguments": ""}}
    out = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [start]},
                                 "finish_reason": None}]},
           {**head, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": args}}]},
                                 "finish_reason": None}]},
           {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append({**head, "choices": [], "usage": usage})
    return out
