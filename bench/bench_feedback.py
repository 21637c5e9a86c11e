"""What feedback costs (not a timed test).

    python bench/bench_feedback.py [--answers 5000] [--prompt-chars 400]

On a local Ray: the answer book (proxray.serve.tenancy.feedback.AnswerBook) as the named actor every ingress replica writes
to. Reports what remembering an answer costs the request (the fire-and-forget submit, per call, in the caller),
how fast the book takes them (calls a second, end to end), a feedback lookup's round trip (p50 / p99) and the book's
memory per answer (its process's RSS growth over ``--answers`` answers of ``--prompt-chars`` characters).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--answers", type=int, default=5000)
    p.add_argument("--prompt-chars", type=int, default=400)
    a = p.parse_args(argv)

    import ray

    from proxray.serve.tenancy.feedback import FeedbackClient

    from proxray.serve.config import FeedbackSpec

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    client = FeedbackClient("bench", FeedbackSpec(max_answers=10 * a.answers))
    book = client._actor()

    def rss() -> float:
        return ray.get(book.__ray_call__.remote(lambda self: __import__("psutil").Process().memory_info().rss))

    ray.get(book.stats.remote())
    base = rss()
    text = ("Tom has 3 boxes of 4 apples and gives away one box. " * 20)[:a.prompt_chars]
    t0 = time.perf_counter()
    submit = []
    for i in range(a.answers):
        t = time.perf_counter()
        client.recorder({"id": f"chatcmpl-{i:08d}"}, f"{i} {text}", "model-a", None, None, 1e-4)(None)
        submit.append(time.perf_counter() - t)
    ray.get(book.stats.remote())  # after every remember (one actor: calls run in order)
    total = time.perf_counter() - t0
    grown = rss() - base
    lookups = []
    for i in range(0, a.answers, max(1, a.answers // 500)):
        t = time.perf_counter()
        assert ray.get(book.find.remote(f"chatcmpl-{i:08d}", None)) is not None
        lookups.append(time.perf_counter() - t)
    q = statistics.quantiles(lookups, n=100)
    out = {"answers": a.answers, "prompt_chars": a.prompt_chars,
           "remember_submit_us_p50": round(1e6 * statistics.median(submit), 1),
           "remember_submit_us_p99": round(1e6 * statistics.quantiles(submit, n=100)[98], 1),
           "book_answers_per_s": round(a.answers / total),
           "lookup_ms_p50": round(1e3 * statistics.median(lookups), 3), "lookup_ms_p99": round(1e3 * q[98], 3),
           "book_bytes_per_answer": round(grown / a.answers)}
    print(json.dumps(out))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
