"""A Messages request as a chat completions request, and a chat completion (or its chunk stream) as a Messages answer
(or its event stream), for every model that does not serve ``/v1/messages`` itself (the CPU engines, vLLM through
ray.serve.llm, OpenAI-compatible endpoints). No HTTP and no Ray: dicts in, dicts out.

Field by field, the rule that applies on the way to chat (declared in ``fields.MESSAGES``, decided here by it):

* sent in chat's words: ``system`` (and ``system`` turns inside ``messages``) as the system message; text, image
  (base64 or URL), ``tool_use`` and ``tool_result`` blocks as chat's text and image parts, ``tool_calls`` and ``tool``
  messages (a tool result's images follow it as a user message); ``max_tokens``, ``stop_sequences`` (``stop``),
  ``temperature``, ``top_p``, ``stream`` (with usage asked for), ``tools`` with ``input_schema`` (functions),
  ``tool_choice`` (``auto``, ``any`` → ``required``, ``tool`` → that function, ``none``) and its
  ``disable_parallel_tool_use`` (``parallel_tool_calls: false``);
* dropped, because chat has no form for them and they only tune how a Messages model works: ``thinking``
  (a model that reasons returns its reasoning all the same, as ``thinking`` blocks), ``context_management``,
  ``output_config``, ``metadata`` (read by the gateway for the session), ``top_k``, ``service_tier``, ``container``,
  ``mcp_servers``; earlier turns' ``thinking`` / ``redacted_thinking`` blocks (chat has no field for them);
* refused by name (a 400 for this model; routing passes it over): a tool without ``input_schema`` (Anthropic's
  server tools), a block chat has no place for (documents, search results, server tool results).
A field the Messages API does not have is dropped too, and named in the report's ``dropped``."""
from __future__ import annotations

import json

from proxray.serve.protocols.core import EventsFromChat, Usage, completion_parts, new_id
from proxray.serve.protocols.fates import DROPPED
from proxray.serve.protocols.messages.fields import chat_fate

READ = {"model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p", "stream", "tools",
        "tool_choice"}
# chat parameters a Messages request spells another way (a chat model's refusal is reported in the client's words)
CHAT_TO_MESSAGES = {"stop": "stop_sequences", "parallel_tool_calls": "tool_choice", "stream_options": "stream"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                "content_filter": "refusal"}


# ---- request -----------------------------------------------------------------------------------------------------
def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text") or "" for b in content or [] if b.get("type") == "text")


def _image(block: dict) -> dict | None:
    src = block.get("source") or {}
    if src.get("type") == "base64" and src.get("data"):
        return {"type": "image_url", "image_url": {"url": f"data:{src.get('media_type')};base64,{src['data']}"}}
    if src.get("type") == "url" and src.get("url"):
        return {"type": "image_url", "image_url": {"url": src["url"]}}
    return None


def _user(content, i: int, problems: dict) -> list:
    """A user turn's chat messages: its tool results first (``tool`` messages, in order), then its own parts."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tools, parts = [], []
    for j, b in enumerate(content):
        kind = b.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": b.get("text") or ""})
        elif kind == "image" and (img := _image(b)):
            parts.append(img)
        elif kind == "tool_result":
            inner = b.get("content")
            text = _text(inner)
            if b.get("is_error"):
                text = f"[the tool failed] {text}"
            tools.append({"role": "tool", "tool_call_id": b.get("tool_use_id") or "", "content": text})
            parts.extend(img for x in (inner if isinstance(inner, list) else []) if x.get("type") == "image"
                         and (img := _image(x)))
        elif kind not in ("thinking", "redacted_thinking"):
            problems.setdefault("messages", f"messages[{i}].content[{j}]: a block of type {kind!r} has no chat "
                                "completions form")
    if not parts:
        return tools
    texts_only = all(p["type"] == "text" for p in parts)
    return tools + [{"role": "user", "content": "\n".join(p["text"] for p in parts) if texts_only else parts}]


def _assistant(content, i: int, problems: dict) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    text, calls = [], []
    for j, b in enumerate(content):
        kind = b.get("type")
        if kind == "text":
            text.append(b.get("text") or "")
        elif kind == "tool_use":
            calls.append({"id": b.get("id") or new_id("toolu"), "type": "function",
                          "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input") or {})}})
        elif kind not in ("thinking", "redacted_thinking"):
            problems.setdefault("messages", f"messages[{i}].content[{j}]: a block of type {kind!r} has no chat "
                                "completions form")
    msg = {"role": "assistant", "content": "\n".join(text) or None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def to_chat(body: dict) -> tuple[dict, dict, list]:
    """(the chat completions body of a Messages ``body``, the problems ``{parameter: why}`` of what chat cannot take,
    the fields dropped by rule)."""
    problems: dict = {}
    system = body.get("system")
    system = [system] if isinstance(system, str) else [_text(system)] if system else []
    msgs = []
    for i, m in enumerate(body["messages"]):
        if m["role"] == "system":
            system.append(_text(m["content"]))
        elif m["role"] == "assistant":
            msgs.append(_assistant(m["content"], i, problems))
        else:
            msgs.extend(_user(m["content"], i, problems))
    system = "\n\n".join(s for s in system if s)
    chat = {"messages": ([{"role": "system", "content": system}] if system else []) + msgs}
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    if body.get("stream"):
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    tools = []
    for k, t in enumerate(body.get("tools") or []):
        if t.get("input_schema") is None:
            problems.setdefault("tools", f"tools[{k}] ({t.get('name')!r}, type {t.get('type')!r}) is a server tool: "
                                "only a model that serves the Messages API runs it")
            continue
        fn = {"name": t["name"], "parameters": t["input_schema"]}
        if t.get("description"):
            fn["description"] = t["description"]
        tools.append({"type": "function", "function": fn})
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if choice:
        kind = choice["type"]
        chat["tool_choice"] = ({"type": "function", "function": {"name": choice["name"]}} if kind == "tool" else
                               {"any": "required"}.get(kind, kind))
        if choice.get("disable_parallel_tool_use") and tools:
            chat["parallel_tool_calls"] = False
    dropped = sorted(k for k in body if k not in READ and chat_fate(k) == DROPPED)
    if any(isinstance(m["content"], list) and any(b.get("type") in ("thinking", "redacted_thinking")
                                                  for b in m["content"]) for m in body["messages"]):
        dropped.append("messages[thinking]")
    return chat, problems, dropped


# ---- answer ------------------------------------------------------------------------------------------------------
def stop_of(finish: str | None, matched, stops) -> tuple[str, str | None]:
    """(``stop_reason``, ``stop_sequence``) of a chat choice's ``finish_reason`` (and vLLM's ``stop_reason``, the stop
    string it matched)."""
    if finish == "stop" and isinstance(matched, str) and matched in (stops or ()):
        return "stop_sequence", matched
    return STOP_REASONS.get(finish or "stop", "end_turn"), None


def usage_of(usage: Usage | None) -> dict:
    """An answer's usage in the Messages API's words (zeros where the model sent none)."""
    return (usage or Usage()).messages()


def _arguments(text: str | None) -> dict:
    try:
        value = json.loads(text or "{}")
        return value if isinstance(value, dict) else {"value": value}
    except ValueError:
        return {"arguments": text}  # what the model wrote, kept where it is not JSON


def from_chat(obj: dict, model: str, stops) -> dict:
    """A chat completion as a Messages answer."""
    msg, finish, matched, usage = completion_parts(obj)
    content = []
    if thought := msg.get("reasoning_content") or msg.get("reasoning"):
        content.append({"type": "thinking", "thinking": thought, "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or new_id("toolu"), "name": fn.get("name"),
                        "input": _arguments(fn.get("arguments"))})
    reason, sequence = stop_of(finish, matched, stops)
    return {"id": new_id("msg"), "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage_of(usage)}


class MessagesWriter:
    """The Messages events of a chat stream (what ``core.EventsFromChat`` tells it): ``message_start`` and a
    ``ping``, each content block opened, filled (``text_delta``, ``thinking_delta``, ``input_json_delta``) and closed
    in turn, then ``message_delta`` (stop reason, usage) and ``message_stop``."""

    def __init__(self, model: str, stops):
        self.model, self.stops = model, stops
        self.index, self.open = -1, None
        self.tools: dict = {}  # chat's tool call index -> block index

    def start(self) -> list:
        message = {"id": new_id("msg"), "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def _close(self) -> list:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.index}]

    def _block(self, kind, block: dict) -> list:
        if self.open == kind:
            return []
        out = self._close()
        self.index += 1
        self.open = kind
        return out + [{"type": "content_block_start", "index": self.index, "content_block": block}]

    def reasoning(self, text: str) -> list:
        return self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""}) + [
            {"type": "content_block_delta", "index": self.index, "delta": {"type": "thinking_delta", "thinking": text}}]

    def text(self, text: str) -> list:
        return self._block("text", {"type": "text", "text": ""}) + [
            {"type": "content_block_delta", "index": self.index, "delta": {"type": "text_delta", "text": text}}]

    def tool(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list:
        out = []
        if index not in self.tools:
            out += self._block(("tool", index), {"type": "tool_use", "id": call_id or new_id("toolu"), "name": name,
                                                 "input": {}})
            self.tools[index] = self.index
        if arguments:
            out.append({"type": "content_block_delta", "index": self.tools[index],
                        "delta": {"type": "input_json_delta", "partial_json": arguments}})
        return out

    def end(self, finish: str | None, matched, usage: Usage | None) -> list:
        reason, sequence = stop_of(finish, matched, self.stops)
        return self._close() + [
            {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
             "usage": usage_of(usage)},
            {"type": "message_stop"}]


def events_from_chat(model: str, stops) -> EventsFromChat:
    """The Messages events of a chat chunk stream answered by ``model``."""
    return EventsFromChat(MessagesWriter(model, stops))
