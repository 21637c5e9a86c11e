"""A stand-in for a hosted, tool-capable coding model on 127.0.0.1, written for the tests (no proxray code in it): it
serves ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/responses``, whole or streamed, each in its own wire format, as a
model that an agent (the Codex CLI) drives would answer:

* a task naming a command in backticks, with no tool output yet: one call of the shell tool the request offers
  (``exec_command`` or ``shell``) with ``{"cmd": <the command>}``;
* after the tool's output: ``The command printed: <its last line>`` (what a shell's start-up files print, e.g.
  pyenv's rehash racing another shell's, comes before the command's own output);
* anything else: ``The answer is 4.``

It bills as OpenAI does: every answer reports the ``service_tier`` it ran at (the one asked, ``priority`` or ``flex``,
else ``default``), billed at that tier's multiple of the base prices; a Responses request that offers the hosted
``web_search`` tool gets a ``web_search_call`` item before its message for each ``[search]`` its prompt says, billed
per call. Every request is recorded (``requests``: path, headers, body), and every answer's bill (``billed``: usage, tier,
hosted calls; :func:`bill` prices one)."""
from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import ThreadingHTTPServer

from standin_http import JSONHandler

SHELL_TOOLS = ("exec_command", "shell")
PRICES = {"input": 2.0, "output": 8.0, "web_search_call": 0.01}  # USD per million tokens; per call
TIERS = {"priority": 2.0, "flex": 0.5, "default": 1.0}  # the published multiple of the base prices


def bill(entry: tuple) -> float:
    """USD the provider bills for one answer ``(usage, tier, hosted calls)`` (``billed``'s entries)."""
    usage, tier, calls = entry
    tokens = usage.get("prompt_tokens", usage.get("input_tokens", 0)) * PRICES["input"] + \
        usage.get("completion_tokens", usage.get("output_tokens", 0)) * PRICES["output"]
    return tokens * TIERS[tier] / 1e6 + calls * PRICES["web_search_call"]


def _tier(body: dict) -> str:
    asked = body.get("service_tier")
    return asked if asked in ("priority", "flex") else "default"


def _decide(turns: list, tools: list) -> tuple[str, str | None]:
    """("call", command) or ("text", answer) from the conversation as (kind, text) pairs and the offered tools' names."""
    if turns and turns[-1][0] == "tool":
        out = next((ln for ln in reversed(turns[-1][1].splitlines()) if ln.strip() and "Output:" not in ln
                    and not ln.startswith(("Chunk ID", "Wall time", "Process exited", "Original token"))), "")
        return "text", f"The command printed: {out.strip()}"
    task = next((t for k, t in reversed(turns) if k == "user"), "")
    command = re.search(r"`([^`]+)`", task)
    shell = next((t for t in SHELL_TOOLS if t in tools), None)
    if command and shell:
        return "call", command.group(1)
    return "text", "The answer is 4."


def _chat_turns(body: dict) -> list:
    out = []
    for m in body.get("messages") or []:
        content = m.get("content")
        text = content if isinstance(content, str) else "\n".join(p.get("text") or "" for p in content or [])
        out.append(("tool" if m.get("role") == "tool" else m.get("role"), text))
    return out


def _responses_turns(body: dict) -> list:
    items = body.get("input")
    items = [{"role": "user", "content": items}] if isinstance(items, str) else items
    out = []
    for it in items:
        if it.get("type") == "function_call_output":
            output = it.get("output")
            out.append(("tool", output if isinstance(output, str) else json.dumps(output)))
        elif it.get("role"):
            content = it.get("content")
            out.append((it["role"], content if isinstance(content, str) else
                        "\n".join(p.get("text") or "" for p in content or [])))
    return out


class AgentStandIn:
    def __init__(self):
        self.requests: list = []
        self.billed: list = []
        self.lock = threading.Lock()
        outer = self

        class Handler(JSONHandler):
            protocol_version = "HTTP/1.1"

            def _events(self, events: list):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for name, obj in events:
                    self.wfile.write((f"event: {name}\n" if name else "") .encode() + f"data: {json.dumps(obj)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

            def do_GET(self):
                models = ["chat-coder", "chat-coder-2", "resp-coder"]
                self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in models]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with outer.lock:
                    outer.requests.append((self.path, dict(self.headers), body))
                if self.path.endswith("/chat/completions"):
                    self._chat(body)
                elif self.path.endswith("/responses"):
                    self._responses(body)
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})

            def _chat(self, body):
                tools = [(t.get("function") or {}).get("name") for t in body.get("tools") or []]
                kind, what = _decide(_chat_turns(body), tools)
                usage = {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020}
                tier = _tier(body)
                head = {"id": "chatcmpl-" + uuid.uuid4().hex[:8], "model": body.get("model"), "created": 0,
                        "service_tier": tier}
                with outer.lock:
                    outer.billed.append((usage, tier, 0))
                if kind == "call":
                    call = {"id": "call_" + uuid.uuid4().hex[:8], "type": "function",
                            "function": {"name": next(t for t in SHELL_TOOLS if t in tools),
                                         "arguments": json.dumps({"cmd": what})}}
                    msg, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
                else:
                    msg, finish = {"role": "assistant", "content": what}, "stop"
                if not body.get("stream"):
                    return self._send(200, {**head, "object": "chat.completion", "usage": usage,
                                            "choices": [{"index": 0, "message": msg, "finish_reason": finish}]})
                chunk = {**head, "object": "chat.completion.chunk"}
                delta = ({"role": "assistant", "tool_calls": [{"index": 0, **msg["tool_calls"][0]}]} if kind == "call"
                         else {"role": "assistant", "content": what})
                self._events([(None, {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
                              (None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
                              (None, {**chunk, "choices": [], "usage": usage})])
                self.wfile.write(b"data: [DONE]\n\n")

            def _responses(self, body):
                tools = [t.get("name") for t in body.get("tools") or [] if t.get("type") == "function"]
                kind, what = _decide(_responses_turns(body), tools)
                if kind == "call":
                    item = {"id": "fc_" + uuid.uuid4().hex[:8], "type": "function_call", "status": "completed",
                            "call_id": "call_" + uuid.uuid4().hex[:8], "arguments": json.dumps({"cmd": what}),
                            "name": next(t for t in SHELL_TOOLS if t in tools)}
                else:
                    item = {"id": "msg_" + uuid.uuid4().hex[:8], "type": "message", "role": "assistant",
                            "status": "completed", "content": [{"type": "output_text", "text": what, "annotations": []}]}
                offered = any(t.get("type") in ("web_search", "web_search_preview") for t in body.get("tools") or [])
                searches = sum(text.count("[search]") for _, text in _responses_turns(body)) if offered else 0
                items = [{"id": "ws_" + uuid.uuid4().hex[:8], "type": "web_search_call", "status": "completed",
                          "action": {"type": "search", "query": f"the answer, part {i + 1}"}}
                         for i in range(searches)] + [item]
                usage = {"input_tokens": 1000, "output_tokens": 20, "total_tokens": 1020,
                         "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
                tier = _tier(body)
                with outer.lock:
                    outer.billed.append((usage, tier, searches))
                r = {"id": "resp_" + uuid.uuid4().hex[:8], "object": "response", "created_at": 0, "status": "completed",
                     "model": body.get("model"), "output": items, "error": None, "incomplete_details": None,
                     "service_tier": tier, "usage": usage}
                if not body.get("stream"):
                    return self._send(200, r)
                seq = iter(range(100))
                started = {**r, "status": "in_progress", "output": [], "usage": None}
                events = [("response.created", {"type": "response.created", "sequence_number": next(seq),
                                                "response": started})]
                for index, it in enumerate(items):
                    events.append(("response.output_item.added", {"type": "response.output_item.added",
                                                                  "output_index": index, "sequence_number": next(seq),
                                                                  "item": it}))
                    if it["type"] == "message":
                        events.append(("response.output_text.delta", {"type": "response.output_text.delta",
                                                                      "item_id": it["id"], "output_index": index,
                                                                      "content_index": 0, "delta": what,
                                                                      "sequence_number": next(seq)}))
                    events.append(("response.output_item.done", {"type": "response.output_item.done",
                                                                 "output_index": index, "sequence_number": next(seq),
                                                                 "item": it}))
                events.append(("response.completed", {"type": "response.completed", "sequence_number": next(seq),
                                                      "response": r}))
                self._events(events)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
