"""API keys with their own policy (``keys_file`` in the app args): each key has a name, its own λ, the models it may
be routed to, a request rate, and a budget in USD over a window — spent past it, its requests are refused with a 429
(``over_budget: reject``) or routed to the cheapest model it allows (``over_budget: cheapest``).

The file holds SHA-256 hashes of the keys, never the keys (``proxray keys new`` adds one and prints the key once); the
operator edits it and every ingress replica reads it again when it changes (checked at most every
``RELOAD_EVERY_S``), no restart. A key's rate and spend are kept in one actor per app (``KeyLedger``, namespace
``proxray``) that every replica asks, so the limits hold across replicas. The single key of ``api_key_file`` /
``api_key_env`` keeps working beside the file, unrestricted.

    keys:
    - name: team-a
      sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      lam: 1000                  # default λ of its routed requests (a request's own lam still wins)
      allowed_models: [meta-llama/Llama-3.2-1B-Instruct, google/gemma-7b-it]
      requests_per_minute: 60
      budget: {usd: 5.0, window_s: 86400, over_budget: cheapest}
"""
from __future__ import annotations

import hashlib
import hmac
import os
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from proxray.serve.shared_actor import SharedActorClient

RELOAD_EVERY_S = 2.0


class KeyBudget(BaseModel):
    model_config = ConfigDict(extra="forbid")
    usd: float = Field(gt=0, description="USD the key may spend per window (the answers' cost at the models' prices)")
    window_s: float = Field(86400.0, gt=0, description="the window, seconds (a day by default)")
    over_budget: Literal["reject", "cheapest"] = Field("reject", description="past the budget: 429, or route to the "
                                                        "cheapest model the key allows")


class KeySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$", description="the key's name in "
                      "metrics, logs and reports")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the key, hex (the key itself is never stored)")
    lam: float | None = Field(None, ge=0, description="default λ of its routed requests")
    allowed_models: list[str] | None = Field(None, min_length=1, description="the models it may reach (routed or "
                                             "by name); default: all")
    requests_per_minute: float | None = Field(None, gt=0, description="its request rate across every replica")
    budget: KeyBudget | None = None


class KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keys: list[KeySpec] = Field(default_factory=list)

    @field_validator("keys")
    @classmethod
    def _unique(cls, keys):
        for field in ("name", "sha256"):
            seen = [getattr(k, field) for k in keys]
            dup = sorted({v for v in seen if seen.count(v) > 1})
            if dup:
                raise ValueError(f"keys: {field} must be unique ({dup[0][:12]}… twice)")
        return keys


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def read_keys(path) -> KeysFile:
    """The keys file, validated (errors name the field)."""
    from proxray.common.yamlconfig import load_yaml_model

    return load_yaml_model(path, KeysFile, "keys file")


class KeyRing:
    """The ingress side: which key a bearer token is (by its hash, in constant time), the file read again when it
    changes. A file that turns invalid keeps the keys read before (and says so in the log)."""

    def __init__(self, path: str):
        self.path = os.path.expanduser(path)
        self.keys: dict = {}
        self.checked = 0.0
        self.mtime = None
        self._load()

    def _load(self) -> None:
        self.mtime = os.stat(self.path).st_mtime_ns
        self.keys = {k.sha256: k for k in read_keys(self.path).keys}

    def refresh(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now - self.checked < RELOAD_EVERY_S:
            return
        self.checked = now
        try:
            if os.stat(self.path).st_mtime_ns != self.mtime:
                self._load()
        except (OSError, ValueError) as e:
            import logging

            logging.getLogger("ray.serve").warning("proxray: keys file %s not reloaded: %s", self.path,
                                                   str(e).splitlines()[0][:200])

    def identify(self, token: str) -> KeySpec | None:
        self.refresh()
        digest = key_hash(token)
        for h, spec in self.keys.items():
            if hmac.compare_digest(h, digest):
                return spec
        return None


class KeyLedger:
    """Requests and spend per key across every ingress replica (the app's shared actor)."""

    def __init__(self):
        self.starts: dict = {}  # name -> recent request times (the last minute)
        self.spent: dict = {}  # name -> [(time, usd)] within the longest window asked

    def admit(self, name: str, rpm: float | None, budget: dict | None, now: float | None = None) -> dict:
        """Whether ``name`` may send a request now: ``{"ok", "reason", "retry_after_s", "spent_usd"}``; an admitted
        request counts toward its rate."""
        now = time.time() if now is None else now
        spent = 0.0
        if budget:
            window = [(t, u) for t, u in self.spent.get(name, []) if t > now - budget["window_s"]]
            self.spent[name] = window
            spent = sum(u for _, u in window)
        if rpm:
            recent = [t for t in self.starts.get(name, []) if t > now - 60.0]
            self.starts[name] = recent
            if len(recent) >= rpm:
                return {"ok": False, "reason": "rate", "retry_after_s": round(recent[0] + 60.0 - now, 3),
                        "spent_usd": spent}
        over = bool(budget) and spent >= budget["usd"]
        self.starts.setdefault(name, []).append(now)
        return {"ok": True, "reason": "over_budget" if over else None, "retry_after_s": 0.0, "spent_usd": spent}

    def charge(self, name: str, usd: float, now: float | None = None) -> None:
        self.spent.setdefault(name, []).append((time.time() if now is None else now, float(usd)))

    def report(self) -> dict:
        return {name: {"spent_usd": sum(u for _, u in v)} for name, v in self.spent.items()}


class LedgerClient(SharedActorClient):
    """The app's ``KeyLedger`` actor, created by the first replica that needs it."""

    actor_cls, prefix = KeyLedger, "proxray-keys"

    async def admit(self, spec: KeySpec) -> dict:
        return await self._actor().admit.remote(spec.name, spec.requests_per_minute,
                                                spec.budget.model_dump() if spec.budget else None)

    def charge(self, name: str, usd: float) -> None:
        self._actor().charge.remote(name, usd)


def new_key_entry(path, name: str, **policy) -> str:
    """Add a key named ``name`` to the keys file at ``path`` (created if absent; written atomically, mode 600) and
    return the key — the only time it is seen; the file keeps its hash."""
    import secrets
    from pathlib import Path

    import yaml

    from proxray.common.storage import replace_atomically

    path = Path(path).expanduser()
    current = read_keys(path) if path.exists() else KeysFile()
    key = "sk-proxray-" + secrets.token_urlsafe(32)
    spec = KeySpec(name=name, sha256=key_hash(key), **{k: v for k, v in policy.items() if v is not None})
    updated = KeysFile(keys=[*current.keys, spec])  # checks the name is new
    replace_atomically(path, yaml.safe_dump(updated.model_dump(exclude_none=True), sort_keys=False).encode())
    os.chmod(path, 0o600)
    return key


class KeyGate:
    """The endpoint's door: who is asking (the single key of ``api_key_file`` / ``api_key_env``, a key of the keys
    file, or nobody where no key is configured), and, for a key of the file, its policy applied to the request
    (allowed models, λ, rate, budget) and its answers' cost charged."""

    def __init__(self, keys_file: str | None, api_key: bytes, app_name: str, prices: dict):
        from ray.util.metrics import Counter

        self.ring = KeyRing(keys_file) if keys_file else None
        self.api_key, self.prices = api_key, prices
        self.ledger = LedgerClient(app_name) if keys_file else None
        self.requests = Counter("proxray_key_requests", "requests by API key (keys file) and outcome: ok, cheapest "
                                "(over budget, routed down), rate, budget, forbidden", tag_keys=("key", "outcome"))
        self.spend = Counter("proxray_key_spend_usd", "USD of the answers given to an API key (keys file)",
                             tag_keys=("key",))

    def identify(self, request) -> KeySpec | None:
        """The key of the request's bearer token (None: the single key, or no auth configured); 401 otherwise."""
        from proxray.serve.errors import RequestError

        if not self.api_key and self.ring is None:
            return None
        header = request.headers.get("authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else ""
        if self.api_key and hmac.compare_digest(token.encode(), self.api_key):
            return None
        spec = self.ring.identify(token) if self.ring is not None and token else None
        if spec is None:
            raise RequestError(401, "missing or invalid API key (Authorization: Bearer …)", kind="authentication_error")
        return spec

    async def admit(self, spec: KeySpec | None, req) -> dict | None:
        """Apply the key's policy to the parsed request ``req`` (its ``proxray`` options and model): 403 for a model
        it may not use, 429 past its rate or (``over_budget: reject``) its budget; over budget with ``cheapest``, λ
        is set so that cost decides. Returns the key's report (name, spent, over budget) or None."""
        from proxray.serve.errors import RequestError
        from proxray.serve.schemas import ROUTER_MODEL

        if spec is None:
            return None
        opts = req.proxray
        if spec.allowed_models is not None:
            if req.model != ROUTER_MODEL and req.model not in spec.allowed_models:
                self.requests.inc(1, {"key": spec.name, "outcome": "forbidden"})
                raise RequestError(403, f"key {spec.name!r} may not use model {req.model!r} (it may use "
                                   f"{', '.join(spec.allowed_models)})", "model", kind="permission_error")
            asked = opts.allowed_models or spec.allowed_models
            opts.allowed_models = [m for m in asked if m in spec.allowed_models] or None
            if opts.allowed_models is None:
                self.requests.inc(1, {"key": spec.name, "outcome": "forbidden"})
                raise RequestError(403, f"proxray.allowed_models: key {spec.name!r} may use none of them (it may use "
                                   f"{', '.join(spec.allowed_models)})", "proxray.allowed_models",
                                   kind="permission_error")
        if opts.lam is None and spec.lam is not None:
            opts.lam = spec.lam
        verdict = await self.ledger.admit(spec)
        if not verdict["ok"]:
            self.requests.inc(1, {"key": spec.name, "outcome": "rate"})
            raise RequestError(429, f"key {spec.name!r}: {spec.requests_per_minute:g} requests a minute at most; "
                               f"retry after {verdict['retry_after_s']:.1f} s", kind="rate_limit_error",
                               headers={"retry-after": str(max(1, int(verdict["retry_after_s"] + 0.999)))})
        over = verdict["reason"] == "over_budget"
        if over and spec.budget.over_budget == "reject":
            self.requests.inc(1, {"key": spec.name, "outcome": "budget"})
            raise RequestError(429, f"key {spec.name!r} spent {verdict['spent_usd']:.6g} USD of its "
                               f"{spec.budget.usd:g} USD budget per {spec.budget.window_s:g} s",
                               kind="insufficient_quota")
        if over:  # cheapest: cost decides among the models it allows
            opts.lam = 1e9
        self.requests.inc(1, {"key": spec.name, "outcome": "cheapest" if over else "ok"})
        return {"name": spec.name, "spent_usd": round(verdict["spent_usd"], 10), "over_budget": over}

    def charger(self, spec: KeySpec | None, model: str, estimate: float | None):
        """A function of an answer's ``usage`` that charges the key its cost at the model's price (the estimate where
        the model has no price or the answer no usage); None for the single key or no auth."""
        if spec is None:
            return None
        price = self.prices.get(model)

        def charge(usage):
            usd = price.cost(usage) if price is not None and usage else None
            if usd is None:
                usd = estimate or 0.0
            if usd > 0:
                self.spend.inc(float(usd), {"key": spec.name})
                self.ledger.charge(spec.name, float(usd))

        return charge
