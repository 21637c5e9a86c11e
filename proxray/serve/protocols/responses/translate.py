"""A Responses request as a chat completions request, and a chat completion (or its chunk stream) as a response
(or its event stream), for the models that do not serve ``/v1/responses`` themselves (the CPU engines, vLLM through
ray.serve.llm, a chat-only endpoint). No HTTP and no Ray: dicts in, dicts out.

Each field's fate is declared in ``fields.RESPONSES`` and decided here by it: sent in chat's words, passed, honoured by
the gateway, answered as empty (``include: ["reasoning.encrypted_content"]``, ``reasoning.summary``: a model answering
through chat returns no reasoning items), dropped and named (``client_metadata``, a namespace's functions, a hosted tool
under ``responses.hosted_tools: drop``, earlier reasoning items), or refused by name (what would change the answer and
has no chat form: ``text.verbosity``, ``truncation: auto``, ``prompt``, ``max_tool_calls``, a custom tool, an input
item or part chat has no place for)."""
from __future__ import annotations

import time

from proxray.serve.protocols.core import EventsFromChat, Usage, completion_parts, new_id
from proxray.serve.protocols.responses.fields import (DROPPED, EMPTY_INCLUDES, HOSTED_TOOLS, PASSED, REFUSED,
                                                      chat_fate)

# chat parameters a Responses request spells another way (a chat model's refusal is reported in the client's words)
CHAT_TO_RESPONSES = {"response_format": "text", "max_completion_tokens": "max_output_tokens", "messages": "input",
                     "reasoning_effort": "reasoning", "logprobs": "top_logprobs", "top_logprobs": "top_logprobs",
                     "tool_choice": "tool_choice", "tools": "tools"}
# the fields to_chat reads itself, value by value (the table's rows field[...] and field.part)
READ = {"model", "input", "instructions", "max_output_tokens", "stream", "text", "tools", "tool_choice", "reasoning",
        "include", "top_logprobs", "truncation"}
ECHOED = ("instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "temperature", "text", "tool_choice",
          "tools", "top_p", "truncation", "user", "reasoning", "top_logprobs", "service_tier")


# ---- input -------------------------------------------------------------------------------------------------------
def input_items(value) -> list:
    """The request's ``input`` as a list of items: a string is one user message; a message item's string content
    becomes one text part. Ids are the client's own (``input_items`` lists the others under ids of the response's)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    items = []
    for item in value:
        item = dict(item)
        if "role" in item and "type" not in item:
            item["type"] = "message"
        if item.get("type") == "message" and isinstance(item.get("content"), str):
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        items.append(item)
    return items


def _part(part: dict, where: str, problems: dict) -> dict | None:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "refusal"):
        return {"type": "text", "text": part.get("text") or part.get("refusal") or ""}
    if kind == "input_image" and part.get("image_url"):
        return {"type": "image_url", "image_url": {"url": part["image_url"], "detail": part.get("detail") or "auto"}}
    problems.setdefault("input", f"{where}: a content part of type {kind!r} has no chat completions form")
    return None


def messages(items: list, instructions: str | None = None) -> tuple[list, dict]:
    """The chat messages of a conversation's items (``instructions`` first, as a system message) and the problems
    (``{parameter: why}``) of what chat has no place for."""
    out, problems = ([{"role": "system", "content": instructions}] if instructions else []), {}
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):
                parts = [p for j, x in enumerate(content) if (p := _part(x, f"input[{i}].content[{j}]", problems))]
                texts_only = all(p["type"] == "text" for p in parts)
                content = "\n".join(p["text"] for p in parts if p["type"] == "text") if texts_only else parts
            role = item.get("role") or "user"
            out.append({"role": "system" if role == "developer" else role, "content": content or ""})
        elif kind == "function_call":
            call = {"id": item.get("call_id") or item.get("id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""}}
            if out and out[-1]["role"] == "assistant":  # calls of one turn: one assistant message
                out[-1].setdefault("tool_calls", []).append(call)
                if not out[-1]["content"]:
                    out[-1]["content"] = None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if isinstance(output, list):
                output = "\n".join(p.get("text") or "" for p in output if isinstance(p, dict))
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output or ""})
        elif kind == "reasoning":
            continue  # a model's own earlier reasoning: chat has no field for it
        else:
            problems.setdefault("input", f"input[{i}]: an item of type {kind!r} has no chat completions form")
    return out, problems


# ---- request -----------------------------------------------------------------------------------------------------
def _tools(body: dict, chat: dict, problems: dict, dropped: list, hosted_tools: str) -> None:
    tools = []
    for i, t in enumerate(body.get("tools") or []):
        kind = t.get("type")
        if kind == "function":
            fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
            tools.append({"type": "function", "function": fn})
        elif kind == "namespace":
            dropped.append(f"tools[{i}] (namespace {str(t.get('name'))[:64]})")
        elif kind in HOSTED_TOOLS and hosted_tools == "drop":
            dropped.append(f"tools[{i}] ({kind})")
        else:
            problems.setdefault("tools", f"tools[{i}]: a {kind!r} tool needs a model that serves the Responses API "
                                "itself; this one answers through chat completions")
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        if tools or choice == "required":
            chat["tool_choice"] = choice  # (a choice among no tools left says nothing: left out)
    elif isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        problems.setdefault("tool_choice", f"tool_choice: {str(choice)[:80]} has no chat completions form")


def _format(body: dict, chat: dict, problems: dict) -> None:
    text = body.get("text") or {}
    fmt = text.get("format") or {"type": "text"}
    if fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}}
    elif fmt.get("type") != "text":
        problems.setdefault("text", f"text.format: type {fmt.get('type')!r} has no chat completions form")
    if text.get("verbosity") is not None:
        problems.setdefault("text", "text.verbosity has no chat completions form")


def to_chat(body: dict, hosted_tools: str = "drop") -> tuple[dict, dict, list]:
    """(the chat completions body of a Responses ``body`` whose ``input`` is the whole conversation, the problems
    ``{parameter: why}`` of what would be refused, the fields dropped and named), each field as ``fields.RESPONSES``
    declares it; ``hosted_tools``: the app's ``responses.hosted_tools``. A stream asks for its usage."""
    items = input_items(body["input"])
    msgs, problems = messages(items, body.get("instructions"))
    dropped = ["input[type=reasoning]"] if any(i.get("type") == "reasoning" for i in items) else []
    chat = {"model": body["model"], "messages": msgs}
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("stream"):
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    _tools(body, chat, problems, dropped, hosted_tools)
    _format(body, chat, problems)
    reasoning = body.get("reasoning") or {}
    if reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    if body.get("top_logprobs"):
        chat["logprobs"], chat["top_logprobs"] = True, body["top_logprobs"]
    for value in body.get("include") or []:
        if value not in EMPTY_INCLUDES:
            problems.setdefault("include", f"include: {str(value)[:80]!r} has no chat completions form")
    if body.get("truncation") not in (None, "disabled"):
        problems.setdefault("truncation", "truncation: has no chat completions form")
    for name, value in body.items():
        if name in READ or value is None:
            continue
        fate = chat_fate(name)
        if fate == PASSED:
            chat[name] = value  # a chat model that cannot honour it refuses it by name
        elif fate == DROPPED:
            dropped.append(name)
        elif fate == REFUSED:
            problems.setdefault(name, f"{name}: has no chat completions form")
    return chat, problems, dropped


# ---- output ------------------------------------------------------------------------------------------------------
def shell(request: dict, rid: str, model: str, previous: str | None, store: bool) -> dict:
    """A response object in progress for ``request`` (the fields a response echoes), with no output yet."""
    r = {"id": rid, "object": "response", "created_at": int(time.time()), "status": "in_progress", "error": None,
         "incomplete_details": None, "model": model, "output": [], "previous_response_id": previous, "store": store,
         "usage": None, "background": False, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
         "text": {"format": {"type": "text"}}, "truncation": "disabled", "metadata": {}}
    r.update({k: request[k] for k in ECHOED if request.get(k) is not None})
    return r


def _message(text: str, status: str = "completed") -> dict:
    return {"id": new_id("msg"), "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _ending(finish: str | None) -> tuple[str, dict | None]:
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _usage(usage: Usage | None) -> dict | None:
    return usage.responses() if usage is not None else None


def from_chat(obj: dict, base: dict) -> dict:
    """A chat completion as a response, on ``base`` (``shell``)."""
    msg, finish, _, usage = completion_parts(obj)
    output = [_message(msg.get("content") or "")] if msg.get("content") or not msg.get("tool_calls") else []
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        output.append({"id": new_id("fc"), "type": "function_call", "status": "completed", "call_id": call.get("id"),
                       "name": fn.get("name"), "arguments": fn.get("arguments") or ""})
    status, incomplete = _ending(finish)
    return {**base, "status": status, "incomplete_details": incomplete, "output": output, "usage": _usage(usage)}


class ResponsesWriter:
    """The Responses API's events of a chat stream (what ``core.EventsFromChat`` tells it): ``response.created``,
    ``response.in_progress``, per output item ``response.output_item.added`` … ``.done`` (text: ``content_part.added``,
    ``output_text.delta``, ``output_text.done``, ``content_part.done``; a function call:
    ``function_call_arguments.delta`` and ``.done``), then ``response.completed`` (or ``response.incomplete``) with the
    whole response and its usage. Reasoning has no item without its encrypted content: it is left out."""

    def __init__(self, base: dict):
        self.base, self.seq = base, 0
        self.output: list = []
        self.text_at: int | None = None  # the output index of the open message
        self.calls: dict = {}  # chat tool-call index -> output index
        self.pieces: dict = {}  # output index -> the deltas of its text or arguments, joined once when it closes

    def _event(self, kind: str, **fields) -> dict:
        e = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return e

    def _add(self, item: dict) -> list:
        self.output.append(item)
        return [self._event("response.output_item.added", output_index=len(self.output) - 1,
                            item={**item, "status": "in_progress", **({"content": []} if item["type"] == "message"
                                                                      else {"arguments": ""})})]

    def _close_text(self) -> list:
        if self.text_at is None:
            return []
        i, item = self.text_at, self.output[self.text_at]
        part = item["content"][0]
        part["text"] = "".join(self.pieces.pop(i, ()))
        self.text_at = None
        return [self._event("response.output_text.done", item_id=item["id"], output_index=i, content_index=0,
                            text=part["text"], logprobs=[]),
                self._event("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                            part=part),
                self._event("response.output_item.done", output_index=i, item=item)]

    def start(self) -> list:
        r = {**self.base, "status": "in_progress", "output": []}
        return [self._event("response.created", response=r), self._event("response.in_progress", response=r)]

    def reasoning(self, text: str) -> list:
        return []

    def text(self, delta: str) -> list:
        events = []
        if self.text_at is None:
            item = _message("", "completed")
            events += self._add(item)
            self.text_at = len(self.output) - 1
            events.append(self._event("response.content_part.added", item_id=item["id"], output_index=self.text_at,
                                      content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                             "logprobs": []}))
        item = self.output[self.text_at]
        self.pieces.setdefault(self.text_at, []).append(delta)
        if delta:
            events.append(self._event("response.output_text.delta", item_id=item["id"], output_index=self.text_at,
                                      content_index=0, delta=delta, logprobs=[]))
        return events

    def tool(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list:
        events = []
        if index not in self.calls:
            events += self._close_text()
            item = {"id": new_id("fc"), "type": "function_call", "status": "completed", "call_id": call_id,
                    "name": name, "arguments": ""}
            events += self._add(item)
            self.calls[index] = len(self.output) - 1
        at = self.calls[index]
        if arguments:
            self.pieces.setdefault(at, []).append(arguments)
            events.append(self._event("response.function_call_arguments.delta", item_id=self.output[at]["id"],
                                      output_index=at, delta=arguments))
        return events

    def end(self, finish: str | None, matched, usage: Usage | None) -> list:
        events = self.text("") if not self.output else []
        events += self._close_text()
        for i in self.calls.values():
            item = self.output[i]
            item["arguments"] = "".join(self.pieces.pop(i, ()))
            events += [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                   arguments=item["arguments"], name=item["name"]),
                       self._event("response.output_item.done", output_index=i, item=item)]
        status, incomplete = _ending(finish)
        r = {**self.base, "status": status, "incomplete_details": incomplete, "output": self.output,
             "usage": _usage(usage)}
        return events + [self._event(f"response.{status}", response=r)]


def events_from_chat(base: dict) -> EventsFromChat:
    """The Responses events of a chat chunk stream, on ``base`` (``shell``)."""
    return EventsFromChat(ResponsesWriter(base))


TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def final_response(obj: dict) -> dict | None:
    """The whole response an answer ends with: the object itself, or a terminal event's ``response``."""
    if obj.get("object") == "response":
        return obj
    if obj.get("type") in TERMINAL:
        return obj.get("response")
    return None


def as_error(obj: dict) -> dict:
    """A served model's event stream in the gateway's terms: an ``error`` event or ``response.failed`` is an error
    object (so it falls back, or ends the client's stream with an error event), anything else as it is."""
    if obj.get("type") == "error":
        status = obj.get("code") if isinstance(obj.get("code"), int) else 500
        return {"error": {"message": obj.get("message") or "the model failed", "type": "server_error",
                          "param": obj.get("param"), "code": status}}
    if obj.get("type") == "response.failed":
        err = (obj.get("response") or {}).get("error") or {}
        return {"error": {"message": err.get("message") or "the model failed", "type": "server_error", "param": None,
                          "code": 500}}
    return obj
