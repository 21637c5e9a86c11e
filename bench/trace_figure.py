"""One routed request's trace, drawn (the serve guide's picture; not a timed test).

    python bench/trace_figure.py [--out docs/figures/trace.png]

Starts the CPU demo's app (bench_serve's: four simulated models, the kNN router over MiniLM) with its ingress
exporting OpenTelemetry spans to a collector stand-in on 127.0.0.1 (OTLP/HTTP, decoded with OpenTelemetry's own
protobuf classes), sends a few routed chat completions with a client ``traceparent`` — the model the router picks first fails every
request, so each falls back to the next — and draws the last one's spans as a waterfall: the server span, ``route``
and the model call, with their attributes.
"""
from __future__ import annotations

import argparse
import os
import secrets
import threading
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def value(v):
    kind = v.WhichOneof("value")
    return [value(x) for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)


def receiver():
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans: list = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            req = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers.get("content-length") or 0)))
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        attrs = {a.key: value(a.value) for a in s.attributes}
                        spans.append({"name": s.name, "kind": s.kind, "trace": s.trace_id.hex(), "id": s.span_id.hex(),
                                      "parent": s.parent_span_id.hex(), "start": s.start_time_unix_nano,
                                      "end": s.end_time_unix_nano, "attrs": attrs})
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", spans


def draw(spans: list, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rank = {2: 0, 1: 1, 3: 2}  # OTLP kinds: the server span, then route (internal), then the model call (client)
    spans = sorted(spans, key=lambda s: rank.get(s["kind"], 3))
    t0, t1 = min(s["start"] for s in spans), max(s["end"] for s in spans)
    keep = ("gen_ai.request.model", "gen_ai.response.model", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
            "proxray.cost_usd", "proxray.chosen_model", "proxray.lam", "proxray.outlier_score", "proxray.fallback_from")
    fig, ax = plt.subplots(figsize=(9, 1.2 + 1.1 * len(spans)))
    for i, s in enumerate(spans):
        a, b = (s["start"] - t0) / 1e6, (s["end"] - t0) / 1e6
        ax.barh(i, max(b - a, 0.05), left=a, color=["tab:green", "tab:blue", "tab:orange"][min(i, 2)], height=0.35)
        shown = [f"{k.split('.', 1)[1]}={v:.3g}" if isinstance(v, float) else
                 f"{k.split('.', 1)[1]}={','.join(v)}" if isinstance(v, list) else f"{k.split('.', 1)[1]}={v}"
                 for k, v in s["attrs"].items() if k in keep]
        lines = [f"{s['name']}  ({b - a:.1f} ms)"] + [", ".join(shown[j:j + 2]) for j in range(0, len(shown), 2)]
        ax.text(0, i - 0.22, "\n".join(lines), fontsize=7.5, va="bottom")
    ax.set_ylim(len(spans) - 0.5, -1.1 - 0.25 * max(len(s["attrs"]) for s in spans) / 2)
    ax.set_xlim(0, (t1 - t0) / 1e6 * 1.02)
    ax.set_yticks([])
    ax.set_xlabel("ms since the request reached the ingress")
    ax.set_title(f"one routed request's trace (trace id {spans[0]['trace'][:12]}…, continued from the client)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    print(f"wrote {out}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="docs/figures/trace.png")
    a = p.parse_args(argv)
    import httpx

    from bench_serve import MODELS, start_demo_app

    url, spans = receiver()
    chat, prompts, stop = start_demo_app(env={"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_BSP_SCHEDULE_DELAY": "200"},
                                         engine_kwargs={MODELS[3]: {"fail_always": True}})  # the router's first pick
    try:
        for i in range(5):  # the first warms the encoder; the last is drawn
            trace = secrets.token_hex(16)
            r = httpx.post(chat, timeout=60, headers={"traceparent": f"00-{trace}-{secrets.token_hex(8)}-01"},
                           json={"model": "proxray", "messages": [{"role": "user", "content": prompts[i]}]})
            r.raise_for_status()
        for _ in range(100):
            mine = [s for s in spans if s["trace"] == trace]
            if len(mine) >= 3:
                break
            time.sleep(0.1)
    finally:
        stop()
    draw(mine, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
