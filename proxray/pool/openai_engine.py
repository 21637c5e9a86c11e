"""The ``openai`` engine: a pool model behind an OpenAI-compatible endpoint proxray does not host (a hosted API, or a
vLLM / SGLang / TGI server another team runs), for the evaluation job (served: ``proxray.serve.deployments.endpoint_server``).

* **Limits across workers.** ``rate_limit`` is kept by one ``RateLimiter`` actor per model and job, which every
  worker asks before a request: requests start at least 60 / requests_per_minute apart (so no minute holds more), and
  a request reserves its prompt estimate + ``max_tokens`` against tokens_per_minute, corrected by the answer's
  ``usage``.
* **Retries** as ``proxray.pool.upstream.verdict`` decides (the relay drives the same state machine): a 408, 409, 429, a 5xx, a timeout or a dropped connection before the
  answer is retried (``max_retries``) after the endpoint's ``Retry-After``, else an exponential backoff; another 4xx (a
  bad request, a refused key, an unknown model) is not, nor an answer whose connection broke after its HTTP 200: the
  row becomes an error row with the endpoint's message, which the job writes to its errors and the next run retries.
* **Keys.** From ``api_key_env`` (an environment variable of the worker) or ``api_key_file``; sent only in the
  ``Authorization`` header; never logged, and scrubbed from every error message.
* **Cost** from the answer's ``usage`` (the endpoint's own token counts) at the model's price.
"""
from __future__ import annotations

import bisect
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor

from proxray.common.secrets import scrub
from proxray.pool.spec import Sampling
from proxray.pool.upstream import RETRY, error_object, probe_headers, verdict  # one module: what an upstream says


def endpoint_key(spec) -> str:
    """The key of an openai model spec, from its file or env var ("" when it names neither; one named but unreadable
    or empty is an error: ``common.secrets.read_secret``)."""
    from proxray.common.secrets import read_secret

    return read_secret(spec.api_key_file, spec.api_key_env)


class RateLimiter:
    """One per model and user of it (the job, the app): the times at which requests may start and the tokens reserved
    in the last minute. ``reserve(tokens, max_wait)`` returns how long the caller waits before sending, the
    reservation made now, or None without reserving anything when the wait would exceed ``max_wait``: a refused
    request takes no slot, so a limiter overloaded for a while serves again as soon as the offered load falls under it."""

    def __init__(self, requests_per_minute: float | None, tokens_per_minute: float | None):
        self.interval = 60.0 / requests_per_minute if requests_per_minute else 0.0
        self.tpm = tokens_per_minute
        self.next_start = 0.0
        self.spent: list = []  # (start time, tokens) of the last minute and of reservations ahead, sorted by time
        self.total = 0  # their tokens: a booking costs a search, not a scan of the minute's bookings

    def _first_live(self, at: float) -> int:
        """The index of the first booking still in the minute before ``at`` (its start + 60 s after ``at``): the same
        sum ``t + 60 > at`` everywhere, so that a start moved to a booking's end always moves past it."""
        i = bisect.bisect_right(self.spent, (at - 60.0, math.inf))
        while i > 0 and self.spent[i - 1][0] + 60.0 > at:
            i -= 1
        while i < len(self.spent) and self.spent[i][0] + 60.0 <= at:
            i += 1
        return i

    def _booked(self, i: int) -> int:
        """Tokens of the bookings from index ``i`` on."""
        return self.total - sum(n for _, n in self.spent[:i]) if i else self.total

    def reserve(self, tokens: int, max_wait: float | None = None, now: float | None = None,
                limits: tuple | None = None) -> float | None:
        """``limits``: (requests_per_minute, tokens_per_minute) as the caller's config has them now (a redeployed app
        with another ``rate_limit`` changes them for the limiter it finds)."""
        if limits is not None:
            self.interval, self.tpm = (60.0 / limits[0] if limits[0] else 0.0), limits[1]
        now = time.time() if now is None else now
        gone = self._first_live(now)
        if gone:
            self.total -= sum(n for _, n in self.spent[:gone])
            del self.spent[:gone]
        start = max(now, self.next_start)
        if self.tpm:
            tokens = min(tokens, self.tpm)  # one request larger than a minute's tokens still goes, alone
            i = self._first_live(start)
            while self._booked(i) + tokens > self.tpm:  # wait for the oldest booking in the window to leave it
                start = self.spent[i][0] + 60.0
                i = self._first_live(start)
        if max_wait is not None and start - now > max_wait:
            return None  # refused: nothing booked
        if self.tpm:
            bisect.insort(self.spent, (start, tokens))
            self.total += tokens
        self.next_start = start + self.interval
        return start - now

    def start_at(self, tokens: int, max_wait: float | None = None, limits: tuple | None = None) -> float | None:
        """Reserve as ``reserve`` does, and return the moment (``time.time()``) the request may start rather than a wait:
        a caller that sleeps until that moment starts on time however late the answer reached it, where a wait counted
        from the answer's arrival would let answers delayed by different amounts send their requests together."""
        now = time.time()
        delay = self.reserve(tokens, max_wait, now, limits)
        return None if delay is None else now + delay

    def correct(self, reserved: int, used: int) -> None:
        """Replace a reservation's estimate by what the answer really used."""
        for i in range(len(self.spent) - 1, -1, -1):
            if self.spent[i][1] == reserved:
                self.spent[i] = (self.spent[i][0], used)
                self.total += used - reserved
                return


class OpenAIEngine:
    """``generate(rows, sampling)`` through ``/chat/completions`` of ``spec.base_url``; one output per row, an
    ``error`` in it where the endpoint failed after its retries (the job's error rows)."""

    def __init__(self, spec, limiter=None):
        import httpx

        self.spec, self.model = spec, spec.source or spec.id
        self.key = endpoint_key(spec)
        self.limiter = limiter
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        from proxray.common.quickack import sync_transport

        self.client = httpx.Client(base_url=spec.base_url.rstrip("/"), headers=headers, timeout=spec.timeout_s,
                                   transport=sync_transport())  # no delayed-ACK stall (proxray.common.quickack)
        self.stats = {"requests": 0, "retries": 0}

    def _wait(self, tokens: int) -> None:
        if self.limiter is not None:
            import ray

            delay = ray.get(self.limiter.start_at.remote(tokens)) - time.time()  # the nodes' clocks agree (NTP)
            if delay > 0:
                time.sleep(delay)

    def _one(self, row: dict, sampling: Sampling) -> dict:
        import httpx

        body = {"model": self.model, "messages": [{"role": "user", "content": row["prompt"]}],
                "max_tokens": sampling.max_tokens, "temperature": sampling.temperature, "seed": sampling.seed}
        if sampling.top_p != 1.0:
            body["top_p"] = sampling.top_p
        estimate = len(str(row["prompt"])) // 3 + sampling.max_tokens
        why = ""
        for attempt in range(self.spec.max_retries + 1):
            self._wait(estimate)
            self.stats["requests"] += 1
            after, status, text = None, None, ""
            try:
                with self.client.stream("POST", "/chat/completions", json=body) as r:
                    status, text, after = r.status_code, r.read().decode(errors="replace"), r.headers.get("retry-after")
            except (httpx.TimeoutException, httpx.TransportError) as e:
                why = f"{type(e).__name__}: {scrub(str(e), key=self.key)}"
                if status == 200:  # it answered, then the connection broke: generated once, never asked again
                    why = f"the answer broke off after HTTP 200 ({why})"
            else:
                if status == 200:
                    return self._answer(json.loads(text), estimate)
                why = f"HTTP {status}: {scrub(text, key=self.key)}"
            decision, wait = verdict(status if status not in (None, 200) else 503, error_object(text), attempt,
                                     self.spec.max_retries, retry_after=after, answered=status == 200)
            if decision != RETRY:  # spent, the request's own fault, or the operator's: the row is an error row
                break
            self.stats["retries"] += 1
            time.sleep(wait)
        return {"response": "", "input_tokens": 0, "output_tokens": 0, "error": f"{self.model} at "
                f"{self.spec.base_url}: {why}"}

    def _answer(self, obj: dict, estimate: int) -> dict:
        usage = obj.get("usage") or {}
        n_in, n_out = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        if self.limiter is not None and (n_in or n_out):
            self.limiter.correct.remote(min(estimate, self.spec.rate_limit.tokens_per_minute or estimate), n_in + n_out)
        choice = (obj.get("choices") or [{}])[0]
        text = (choice.get("message") or {}).get("content") or ""
        return {"response": text, "input_tokens": n_in, "output_tokens": n_out}

    def generate(self, rows, sampling: Sampling = Sampling()):
        with ThreadPoolExecutor(min(self.spec.max_concurrency, max(len(rows), 1))) as pool:
            return list(pool.map(lambda r: self._one(r, sampling), rows))

    def stream(self, messages, prompt, sampling: Sampling = Sampling(), stop=()):
        raise NotImplementedError("served, an endpoint's model is relayed as it is (proxray.serve.deployments.endpoint_server)")


def probe(spec) -> str | None:
    """What stops an openai model before any work, from one ``GET /models``: an unreachable URL, a refused key, a
    model the endpoint does not list. None when it would answer."""
    import httpx

    try:
        key = endpoint_key(spec)
    except ValueError as e:
        return f"model {spec.id!r}: {e}"
    where = f"model {spec.id!r}: {spec.base_url}"
    try:
        r = httpx.get(spec.base_url.rstrip("/") + "/models", timeout=min(spec.timeout_s, 20.0), headers=probe_headers(key))
    except (httpx.TimeoutException, httpx.TransportError) as e:
        return f"{where}: cannot reach it ({type(e).__name__}: {scrub(str(e), key=key)})"
    if r.status_code in (401, 403):
        return f"{where}: the key was refused (HTTP {r.status_code})"
    if r.status_code != 200:
        return f"{where}: GET /models answered HTTP {r.status_code}: {scrub(r.text, key=key)}"
    try:
        listed = [m.get("id") for m in r.json().get("data", [])]
    except ValueError:
        return f"{where}: GET /models did not answer JSON"
    name = spec.source or spec.id
    if listed and name not in listed:
        return f"{where}: serves no model {name!r} (it lists {', '.join(map(str, listed[:10]))})"
    return None
