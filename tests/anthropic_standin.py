"""A stand-in for Anthropic's Messages API on 127.0.0.1, written for the tests (no proxray code in it): ``x-api-key``,
``GET /v1/models``, ``POST /v1/messages`` (whole and streamed) and ``/v1/messages/count_tokens``, billing its prompt
cache as Anthropic documents it — a request whose system carries ``cache_control`` writes its prompt to the cache
(``cache_creation_input_tokens``, split by lifetime in ``cache_creation``; ``"ttl": "1h"`` the one-hour cache, billed
higher) the first time and reads it (``cache_read_input_tokens``) after — and a hosted tool
(``web_search``: one ``server_tool_use.web_search_requests`` per request that offers it). ``bill(usage)`` prices a usage
at its published prices. Two faults a client's body can provoke: ``[echo-404]`` in the ask answers a 404 echoing an id
("Item with id 'rs_x-model' not found."), ``[policy-403]`` a 403 permission error; the key is never the cause.
``[slow]`` in the ask: the answer is generated and billed at once and sent 3 s later, whoever still reads it. Its
long-context tier: a request with the ``context-1m`` beta whose prompt (cached or not) is over
``LONG_CONTEXT["above_tokens"]`` is billed at that tier's multiples of every price (its record in ``billed`` says
``long_context``)."""
from __future__ import annotations

import json
import threading
import time
from http.server import ThreadingHTTPServer

from standin_http import JSONHandler

MODEL = "claude-standin-1"
MAX_TOKENS = 64_000  # the most a request may ask of the model (a larger max_tokens is a 400)
# USD per million tokens, and per search, as the stand-in's provider publishes them
PRICES = {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_write_1h": 6.0, "cache_read": 0.30,
          "web_search": 0.01}
ANSWER = ["The", " answer", " is", " 42."]
LONG_CONTEXT = {"above_tokens": 40, "input": 2.0, "output": 1.5}  # the stand-in's 200,000-token tier, made small


def bill(usage: dict) -> float:
    """USD the provider bills for one answer's ``usage``."""
    hour = (usage.get("cache_creation") or {}).get("ephemeral_1h_input_tokens", 0)  # the one-hour cache's writes
    m_in, m_out = (LONG_CONTEXT["input"], LONG_CONTEXT["output"]) if usage.get("long_context") else (1.0, 1.0)
    return ((usage.get("input_tokens", 0) * PRICES["input"]
             + (usage.get("cache_creation_input_tokens", 0) - hour) * PRICES["cache_write"]
             + hour * PRICES["cache_write_1h"]
             + usage.get("cache_read_input_tokens", 0) * PRICES["cache_read"]) * m_in
            + usage.get("output_tokens", 0) * PRICES["output"] * m_out) / 1e6 \
        + (usage.get("server_tool_use") or {}).get("web_search_requests", 0) * PRICES["web_search"]


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return " ".join(b.get("text", "") for b in content if isinstance(b, dict))


class AnthropicStandIn:
    def __init__(self, key: str):
        self.key, self.cached, self.requests = key, set(), []
        self.billed: list = []  # the usage of every answer it generated (what its provider would bill), in order
        self.lock = threading.Lock()
        outer = self

        class Handler(JSONHandler):
            def _authorized(self):
                if self.headers.get("x-api-key") != outer.key:
                    self._send(401, {"type": "error", "error": {"type": "authentication_error",
                                                                "message": "invalid x-api-key"}})
                    return False
                return True

            def do_GET(self):
                if self._authorized():
                    self._send(200, {"data": [{"id": MODEL, "type": "model"}], "has_more": False})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with outer.lock:
                    outer.requests.append((self.path, dict(self.headers), body))
                if not self._authorized():
                    return
                system = body.get("system")
                prompt = _text(system or "") + " " + " ".join(_text(m["content"]) for m in body.get("messages", []))
                words = len(prompt.split()) + 3
                if self.path.endswith("/count_tokens"):
                    self._send(200, {"input_tokens": words})
                    return
                if body.get("model") != MODEL:
                    self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": f"model: {body.get('model')}"}})
                    return
                if int(body.get("max_tokens") or 0) > MAX_TOKENS:  # as Anthropic refuses a limit past the model's
                    self._send(400, {"type": "error", "error": {"type": "invalid_request_error", "message":
                                     f"max_tokens: {body['max_tokens']} > {MAX_TOKENS}, the maximum allowed"}})
                    return
                if "[echo-404]" in prompt:
                    self._send(404, {"type": "error", "error": {"type": "not_found_error",
                                                                "message": "Item with id 'rs_x-model' not found."}})
                    return
                if "[policy-403]" in prompt:
                    self._send(403, {"type": "error", "error": {"type": "permission_error",
                                                                "message": "This request is refused by policy."}})
                    return
                usage = {"input_tokens": words, "output_tokens": len(ANSWER)}
                if isinstance(system, list) and any("cache_control" in b for b in system):
                    cached = 1000 + len(_text(system).split())  # the cached prefix, as the provider counts it
                    with outer.lock:
                        first = _text(system) not in outer.cached
                        outer.cached.add(_text(system))
                    usage["cache_creation_input_tokens" if first else "cache_read_input_tokens"] = cached
                    if first:  # the write's split by lifetime, as Anthropic reports it
                        hour = any((b.get("cache_control") or {}).get("ttl") == "1h" for b in system)
                        usage["cache_creation"] = {"ephemeral_5m_input_tokens": 0 if hour else cached,
                                                   "ephemeral_1h_input_tokens": cached if hour else 0}
                if any(t.get("type", "").startswith("web_search") for t in body.get("tools") or []):
                    usage["server_tool_use"] = {"web_search_requests": 1}
                prompt_tokens = sum(usage.get(k, 0) for k in ("input_tokens", "cache_creation_input_tokens",
                                                               "cache_read_input_tokens"))
                tiered = "context-1m" in (self.headers.get("anthropic-beta") or "") and \
                    prompt_tokens > LONG_CONTEXT["above_tokens"]
                with outer.lock:  # generated whole, whether or not its reader stays to the end
                    outer.billed.append({**usage, "long_context": True} if tiered else usage)
                message = {"id": "msg_standin", "type": "message", "role": "assistant", "model": MODEL,
                           "stop_reason": "end_turn", "stop_sequence": None}
                if "[slow]" in prompt:
                    time.sleep(3.0)
                if not body.get("stream"):
                    self._send(200, {**message, "content": [{"type": "text", "text": "".join(ANSWER)}], "usage": usage})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                start_usage = {k: v for k, v in usage.items() if k != "output_tokens"} | {"output_tokens": 1}
                events = [{"type": "message_start", "message": {**message, "content": [], "stop_reason": None,
                                                                 "usage": start_usage}},
                          {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]
                events += [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}
                           for w in ANSWER]
                events += [{"type": "content_block_stop", "index": 0},
                           {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                            "usage": {"output_tokens": usage["output_tokens"]}},
                           {"type": "message_stop"}]
                for e in events:
                    self.wfile.write(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode())
                    self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
