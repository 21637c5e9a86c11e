"""A stand-in for a hosted OpenAI-compatible API on 127.0.0.1, written for the tests (no proxray code in it): a bearer
key, ``GET /v1/models``, ``POST /v1/chat/completions`` with ``usage``, and faults on a prompt's first try — a 429
with Retry-After, a 500, a connection dropped without an answer — or always for prompts that ask for it (``[refuse]``: a
400, ``[down]``: a 500); ``revoke()`` makes it refuse the key it was given (401) until ``restore()``.
Every request is recorded (time, prompt, what it answered), so a test can count them."""
from __future__ import annotations

import json
import threading
import time
import zlib
from http.server import ThreadingHTTPServer

from standin_http import JSONHandler

MODEL = "acme/frontier-1"


def key_file(folder):
    """A new key and the file that holds it (mode 600), as an operator writes it for the gateway: (key, path)."""
    import os
    import secrets

    key = "sk-" + secrets.token_hex(16)
    old = os.umask(0o077)
    (folder / "api_key").write_text(key + "\n")
    os.umask(old)
    return key, folder / "api_key"


class StandIn:
    def __init__(self, key: str, faults: bool = True):
        self.key, self.faults = key, faults
        self.log: list = []  # (time, prompt, status)
        self.requests: list = []  # (headers, body) of every chat request
        self.seen: dict = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(JSONHandler):
            def _stream(self, body, prompt):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                head = {"id": "c2", "object": "chat.completion.chunk", "model": MODEL}
                words = ["The", " answer", " is", " 42."]
                chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": w} if i == 0 else
                                                {"content": w}, "finish_reason": None}]} for i, w in enumerate(words)]
                chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    chunks.append({**head, "choices": [], "usage": {"prompt_tokens": len(prompt.split()),
                                                                    "completion_tokens": 4, "total_tokens": len(prompt.split()) + 4}})
                for c in chunks:
                    self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _authorized(self):
                if self.headers.get("Authorization") != f"Bearer {outer.key}":
                    token = (self.headers.get("Authorization") or "")[7:]  # a fragment of it, as hosted APIs say
                    self._send(401, {"error": {"message": f"Incorrect API key provided: {token[:5]}****{token[-4:]}",
                                               "type": "invalid_request_error"}})
                    return False
                return True

            def do_GET(self):
                if self._authorized():
                    self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with outer.lock:
                    outer.requests.append((dict(self.headers), body))
                if not self._authorized():
                    return
                prompt = body["messages"][-1]["content"]
                with outer.lock:
                    tries = outer.seen[prompt] = outer.seen.get(prompt, 0) + 1
                kind = zlib.crc32(prompt.encode()) % 6 if outer.faults else 5
                status = 200
                if body.get("model") != MODEL:
                    status = 404
                elif "[missing-item]" in prompt:  # what OpenAI answers for an item the request names that it lacks
                    status = 4040
                elif "[break]" in prompt:  # answers 200, then the connection breaks in the body
                    status = -2
                elif "[refuse]" in prompt:
                    status = 400
                elif "[down]" in prompt:
                    status = 500
                elif tries == 1 and kind == 0:
                    status = 429
                elif tries == 1 and kind == 1:
                    status = 500
                elif tries == 1 and kind == 2:
                    status = -1  # the connection drops
                with outer.lock:
                    outer.log.append((time.time(), prompt, status))
                if status == -1:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if status == -2:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "4096")
                    self.end_headers()
                    self.wfile.write(b'{"id": "c1", "object": "chat.comp')
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if status == 4040:
                    self._send(404, {"error": {"message": "Item with id 'rs_0123' not found.", "code": None,
                                               "type": "invalid_request_error", "param": "input"}})
                    return
                if status == 429:
                    self._send(429, {"error": {"message": "Rate limit reached", "type": "rate_limit"}},
                               [("Retry-After", "0.2")])
                elif status != 200:
                    self._send(status, {"error": {"message": f"refused ({status})", "type": "invalid_request_error"}})
                elif body.get("stream"):
                    self._stream(body, prompt)
                else:
                    answer = "The answer is 42."
                    self._send(200, {"id": "c1", "object": "chat.completion", "model": MODEL,
                                     "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant", "content": answer}}],
                                     "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": 5,
                                               "total_tokens": len(prompt.split()) + 5}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def revoke(self):
        self.key, self._kept = "revoked-" + self.key, self.key

    def restore(self):
        self.key = self._kept

    def answered(self) -> dict:
        """{prompt: how many 200s it got}."""
        out = {}
        for _, p, s in self.log:
            out[p] = out.get(p, 0) + (s == 200)
        return out

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
