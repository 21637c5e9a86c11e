"""An OTLP/HTTP trace receiver on 127.0.0.1 for tests: what a collector is sent (``POST /v1/traces``, protobuf),
decoded with OpenTelemetry's own protobuf classes."""
import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list = []  # one dict a span: name, trace_id, span_id, parent_id, kind, attributes, service
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    raw = gzip.decompress(raw)
                req = ExportTraceServiceRequest.FromString(raw)
                got = []
                for rs in req.resource_spans:
                    service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), None)
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            got.append({"name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                        "parent_id": s.parent_span_id.hex(), "kind": s.kind, "service": service,
                                        "status": s.status.code, "start": s.start_time_unix_nano,
                                        "end": s.end_time_unix_nano,
                                        "attributes": {a.key: _value(a.value) for a in s.attributes}})
                with outer.lock:
                    outer.spans += got
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def trace(self, trace_id: str, n: int, timeout_s: float = 30.0) -> list:
        """The spans of ``trace_id`` once there are at least ``n`` (bounded wait)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                got = [s for s in self.spans if s["trace_id"] == trace_id]
            if len(got) >= n:
                return got
            time.sleep(0.1)
        raise AssertionError(f"trace {trace_id}: {len(got)} spans of {n} within {timeout_s:.0f} s: {got}")

    def stop(self):
        self.server.shutdown()


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None
