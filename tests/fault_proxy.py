"""A fault-injecting HTTP proxy on 127.0.0.1 in front of a real OpenAI-compatible server (no proxray code in it).

``FaultProxy(upstream, plan)`` forwards every request to ``upstream`` (its ``/v1`` base URL) as sent, headers
included, and relays the answer, a stream chunk by chunk. ``plan(prompt, tries)`` picks the fault for the ``tries``-th
request carrying that prompt (its last message's text), or None:

* ``"429"``: answered 429 with ``Retry-After: 0.2``, not forwarded;
* ``"500"``: answered 500, not forwarded;
* ``"drop"``: the connection closed without an answer, not forwarded;
* ``"slow"``: forwarded after ``slow_s`` seconds;
* ``"cut"``: forwarded; the answer's first two stream events (or first half of its body) relayed, then the connection
  closed.

Every request is logged as (time, prompt, fault, forwarded), so a test counts what reached the server.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def prompt_of(body: dict) -> str:
    """The last message's text (a Responses request: its input's, or the last input item's first part's)."""
    value = body.get("input")
    if isinstance(value, list) and value:
        value = value[-1].get("content")
        value = value[0].get("text") if isinstance(value, list) and value else value
    if isinstance(value, str):
        return value
    if body.get("messages"):
        content = body["messages"][-1].get("content")
        return content if isinstance(content, str) else json.dumps(content)
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


class FaultProxy:
    def __init__(self, upstream: str, plan, slow_s: float = 3.0):
        import httpx

        self.upstream, self.plan, self.slow_s = upstream.rstrip("/"), plan, slow_s
        self.log: list = []
        self.tries: dict = {}
        self.paths: dict = {}  # prompt -> the path its last request was sent to
        self.lock = threading.Lock()
        client = httpx.Client(timeout=120)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _headers(self):
                return {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}

            def _reply(self, status, obj, extra=()):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in extra:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _drop(self):
                self.close_connection = True
                self.connection.shutdown(2)

            def do_GET(self):
                r = client.get(outer.upstream + self.path.removeprefix("/v1"), headers=self._headers())
                self._reply(r.status_code, r.json())

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw or b"{}")
                prompt = prompt_of(body)
                with outer.lock:
                    tries = outer.tries[prompt] = outer.tries.get(prompt, 0) + 1
                fault = outer.plan(prompt, tries)
                forwarded = fault in (None, "slow", "cut")
                with outer.lock:
                    outer.log.append((time.time(), prompt, fault, forwarded))
                    outer.paths[prompt] = self.path
                if fault == "429":
                    return self._reply(429, {"error": {"message": "Rate limit reached", "type": "rate_limit"}},
                                       [("Retry-After", "0.2")])
                if fault == "500":
                    return self._reply(500, {"error": {"message": "upstream overloaded", "type": "server_error"}})
                if fault == "drop":
                    return self._drop()
                if fault == "slow":
                    time.sleep(outer.slow_s)
                url = outer.upstream + self.path.removeprefix("/v1")
                with client.stream("POST", url, content=raw, headers=self._headers()) as r:
                    if not body.get("stream") or r.status_code != 200:
                        data = r.read()
                        if fault == "cut":
                            self.send_response(r.status_code)
                            self.send_header("Content-Type", "application/json")
                            self.send_header("Content-Length", str(len(data)))
                            self.end_headers()
                            self.wfile.write(data[: len(data) // 2])
                            self.wfile.flush()
                            return self._drop()
                        self.send_response(r.status_code)
                        self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    events = 0
                    for line in r.iter_lines():
                        if not line:
                            continue
                        if fault == "cut" and events == 2:
                            self.wfile.flush()
                            return self._drop()  # mid-stream: no terminating chunk
                        data = f"{line}\n\n".encode()
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                        events += 1
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forwarded(self) -> dict:
        """{prompt: how many of its requests reached the server}."""
        out: dict = {}
        for _, p, _, f in self.log:
            out[p] = out.get(p, 0) + f
        return out

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
