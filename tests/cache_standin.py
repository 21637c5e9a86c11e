"""A stand-in for a hosted Messages API on 127.0.0.1 that bills prompt caching as Anthropic documents it, for several
models at once (no proxray code in it): each model has its own cache; a request's prompt — its tools, its system
blocks, then its messages' blocks, in that order — is cached up to its last ``cache_control`` breakpoint once that
prefix is at least ``min_tokens`` long (``cache_creation_input_tokens``, at the write price); a later request whose
prompt begins with a prefix the model still holds reads it (``cache_read_input_tokens``, at the read price); a cached
prefix lives ``ttl_s`` after its last use (each read refreshes it). Tokens are a token per 4 characters of each
block's JSON. Every answer is ``output_tokens`` long (at most the request's ``max_tokens``). ``bill(model, usage)``
prices a usage at the model's prices; ``billed`` keeps each answer's (model, usage, USD)."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import ThreadingHTTPServer

from standin_http import JSONHandler

# USD per million tokens, as the providers publish them (Sonnet-like and Haiku-like)
PRICES = {"claude-large": {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.30},
          "claude-small": {"input": 1.0, "output": 5.0, "cache_write": 1.25, "cache_read": 0.10}}


def tokens(obj) -> int:
    return max(1, len(json.dumps(obj, separators=(",", ":"))) // 4)


def blocks(body: dict) -> list:
    """The prompt as (block, cache breakpoint?) in the order the provider caches it."""
    out = [(t, "cache_control" in t) for t in body.get("tools") or []]
    system = body.get("system") or []
    system = [{"type": "text", "text": system}] if isinstance(system, str) else system
    out += [(b, "cache_control" in b) for b in system]
    for m in body.get("messages") or []:
        content = m.get("content")
        content = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        out += [({"role": m.get("role"), **b}, "cache_control" in b) for b in content]
    return out


class CacheStandIn:
    def __init__(self, key: str, prices: dict | None = None, ttl_s: float = 300.0, min_tokens: int = 1024,
                 output_tokens: int = 300):
        self.key, self.prices, self.ttl_s, self.min_tokens = key, prices or PRICES, ttl_s, min_tokens
        self.output_tokens = output_tokens
        self.cache: dict = {}  # (model, prefix digest) -> expires at
        self.billed: list = []  # (model, usage, USD) of every answer, in order
        self.lock = threading.Lock()
        outer = self

        class Handler(JSONHandler):
            def do_GET(self):
                self._send(200, {"data": [{"id": m, "type": "model"} for m in outer.prices], "has_more": False})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.headers.get("x-api-key") != outer.key:
                    self._send(401, {"type": "error", "error": {"type": "authentication_error", "message": "key"}})
                    return
                model = body.get("model")
                if model not in outer.prices:
                    self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": model}})
                    return
                if self.path.endswith("/count_tokens"):
                    self._send(200, {"input_tokens": sum(tokens(b) for b, _ in blocks(body))})
                    return
                usage = outer.usage(model, body)
                message = {"id": "msg_cache_standin", "type": "message", "role": "assistant", "model": model,
                           "stop_reason": "end_turn", "stop_sequence": None,
                           "content": [{"type": "text", "text": "Done. " * (usage["output_tokens"] // 2)}]}
                if not body.get("stream"):
                    self._send(200, {**message, "usage": usage})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                text = message["content"][0]["text"]
                events = [{"type": "message_start", "message": {**message, "content": [], "stop_reason": None,
                                                                 "usage": {**usage, "output_tokens": 1}}},
                          {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                          {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
                          {"type": "content_block_stop", "index": 0},
                          {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": usage["output_tokens"]}},
                          {"type": "message_stop"}]
                for e in events:
                    self.wfile.write(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode())
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def usage(self, model: str, body: dict, now: float | None = None) -> dict:
        """The usage a request is billed: the longest prefix the model holds read, the prompt up to its last
        breakpoint written where it is long enough and not held, the rest input."""
        now = time.time() if now is None else now
        digest, total, bounds = hashlib.sha256(), 0, []  # (tokens through the block, digest, breakpoint?)
        for b, mark in blocks(body):
            digest.update(json.dumps({k: v for k, v in b.items() if k != "cache_control"}, sort_keys=True).encode())
            total += tokens(b)
            bounds.append((total, digest.hexdigest(), mark))
        last = max((i for i, (_, _, mark) in enumerate(bounds) if mark), default=None)
        with self.lock:
            read = 0
            for n, d, _ in bounds[: (last + 1) if last is not None else 0]:
                if self.cache.get((model, d), 0) >= now:
                    read = n
                    self.cache[(model, d)] = now + self.ttl_s  # a read refreshes it
            written = 0
            if last is not None and bounds[last][0] >= self.min_tokens:
                written = bounds[last][0] - read
                for n, d, mark in bounds[: last + 1]:
                    if mark and n >= self.min_tokens:
                        self.cache[(model, d)] = now + self.ttl_s
            usage = {"input_tokens": total - read - written, "output_tokens": min(self.output_tokens,
                                                                                  int(body.get("max_tokens") or 1))}
            if read:
                usage["cache_read_input_tokens"] = read
            if written:
                usage["cache_creation_input_tokens"] = written
            self.billed.append((model, usage, self.bill(model, usage)))
        return usage

    def bill(self, model: str, usage: dict) -> float:
        p = self.prices[model]
        return (usage.get("input_tokens", 0) * p["input"] + usage.get("output_tokens", 0) * p["output"]
                + usage.get("cache_creation_input_tokens", 0) * p["cache_write"]
                + usage.get("cache_read_input_tokens", 0) * p["cache_read"]) / 1e6

    def reset(self) -> None:
        with self.lock:
            self.cache.clear()
            self.billed.clear()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
