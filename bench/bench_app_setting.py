"""What one app setting costs a request (not a timed test): two proxray apps on one Serve behind its HAProxy front,
their args one setting apart, the same named pass-through sent to each in turn.

    python bench/bench_app_setting.py --variant '{"feedback": {"enabled": false}}' [--requests 900] [--json out.json]
    python bench/bench_app_setting.py --variant '{}'      # the two apps alike: the reading's own spread

One stand-in OpenAI upstream on 127.0.0.1 answers at once (``bench_relay_stall.standin``, ``TCP_NODELAY``). Both apps
serve it as an ``engine: openai`` pool member beside the demo's simulated models, with one keys file and a key with no
rate or budget: ``as shipped`` at ``/``, ``variant`` (the same args updated with ``--variant``) at ``/variant``. One
request at a time, in six rounds interleaving direct, as shipped and variant; p50 / p95 / p99 of each and what each
app adds over direct. Interleaved on one Serve, both meet the same machine: a difference that an A/A run (``{}``)
does not show is the setting's.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_gateways import pct  # noqa: E402
from bench_relay_stall import standin  # noqa: E402
from report import emit  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", required=True, help="JSON: the app args the second app has otherwise")
    p.add_argument("--requests", type=int, default=900, help="per target, over six rounds")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    variant = json.loads(a.variant)

    import httpx

    from bench_serve import start_demo_app
    from proxray.common.quickack import sync_transport
    from proxray.serve.front import FRONT
    from proxray.serve.tenancy.keys import new_key_entry

    os.environ.update({name: "1" for name in FRONT})  # HAProxy's front, before Ray starts
    upstream = f"http://127.0.0.1:{standin(nodelay=True)}/v1"
    keys = os.path.join(tempfile.mkdtemp(), "keys.yaml")
    key = new_key_entry(keys, "open")
    model = {"id": "standin", "engine": "openai", "base_url": upstream, "timeout_s": 10,
             "price": {"input_per_mtok": 1.0, "output_per_mtok": 1.0}}
    chat_url, _, stop = start_demo_app(encoder="static", extra_models=[model], new_models=["standin"], keys_file=keys,
                                       variants={"variant": variant})
    try:
        transport = dict(timeout=30, transport=sync_transport())
        app = httpx.Client(base_url=chat_url.removesuffix("/v1/chat/completions"),
                           headers={"Authorization": f"Bearer {key}"}, **transport)
        direct = httpx.Client(base_url=upstream.removesuffix("/v1"), **transport)
        body = json.dumps({"model": "standin", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "What is 17 * 23?"}]}).encode()
        targets = {"direct": (direct, "/v1/chat/completions"), "as shipped": (app, "/v1/chat/completions"),
                   "variant": (app, "/variant/v1/chat/completions")}

        def once(client, path) -> float:
            t0 = time.perf_counter()
            r = client.post(path, content=body)
            if r.status_code != 200:
                raise RuntimeError(f"{path}: {r.status_code} {r.text[:300]}")
            return 1e3 * (time.perf_counter() - t0)

        for _ in range(30):  # warm-up: connections, each app's first requests
            for client, path in targets.values():
                once(client, path)
        lat = {name: [] for name in targets}
        for _ in range(6):
            for name, (client, path) in targets.items():
                lat[name] += [once(client, path) for _ in range(a.requests // 6)]
    finally:
        stop()
    res = {"variant": variant, "requests": a.requests, "hardware": f"{os.cpu_count()} CPUs", "ms": {}}
    for name, values in lat.items():
        res["ms"][name] = {f"p{int(q * 100)}": round(pct(values, q), 2) for q in (0.5, 0.95, 0.99)}
        res["ms"][name].update({f"added_p{int(q * 100)}": round(pct(values, q) - pct(lat["direct"], q), 2)
                                for q in (0.5, 0.95)})
    res["variant_less_shipped_added_p95_ms"] = round(res["ms"]["variant"]["added_p95"]
                                                     - res["ms"]["as shipped"]["added_p95"], 2)
    emit(res, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
