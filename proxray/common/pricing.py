"""The one cost function: what an answer costs from its token counts and the model's prices per million tokens, and the
one usage record (``Usage``) those counts are read into from every API's words."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def answer_cost(price, usage, estimate: float | None = None) -> tuple[float | None, bool]:
    """What one answer costs, the one rule budgets, keys and feedback charge by: its ``usage`` tokens at the model's
    ``price`` (a ``Price``) where both are known (metered: True), else the router's ``estimate`` (metered: False;
    None without one)."""
    real = price.cost(usage) if price is not None and usage else None
    return (float(real), True) if real is not None else (estimate, False)


def token_cost(input_tokens, output_tokens, input_per_mtok, output_per_mtok):
    """USD = input tokens × input price + output tokens × output price, prices in USD per million tokens.
    Numbers or arrays (broadcast: e.g. tokens (n, 1) or (n, M) against prices (M,))."""
    return (np.asarray(input_tokens, dtype=np.float64) * np.asarray(input_per_mtok, dtype=np.float64)
            + np.asarray(output_tokens, dtype=np.float64) * np.asarray(output_per_mtok, dtype=np.float64)) / 1e6


@dataclass(frozen=True)
class TokenBound:
    """The most a request can cost in tokens — the one bound holds, rate limits and an answer without usage are charged
    by (``proxray.serve.wire.measure`` measures a body once): ``prompt``, its whole body (messages, tools, schemas,
    instructions, a Responses conversation's history; a token for every 3 characters, more than any tokenizer gives for
    text); ``output``, its output limit (``limit``) for each of its answers; whether it asks its provider to write its
    prompt to a cache (``writes_cache``: ``"5m"`` or ``"1h"``, the lifetime it asks; ``""``: none); its hosted tools
    (``hosted``: (index, type) of each) and the calls it bounds them to (``tool_calls``); ``chars``, its JSON's length
    (what a conversation's expected prompt is counted from); ``tier``, the service tier it asks."""

    prompt: int = 0
    output: int = 0
    writes_cache: str = ""
    hosted: tuple = ()
    tool_calls: int = 0
    chars: int = 0
    limit: int = 0
    tier: str = ""  # the service tier it asks (OpenAI's ``service_tier``), which may be billed higher
    audio: bool = False  # whether it asks for a spoken answer (chat's ``modalities`` with ``audio``), billed higher

    @property
    def tokens(self) -> int:
        return self.prompt + self.output


# tools the provider runs and bills apart (Anthropic's and the Responses API's server-side tools), by their type's start
HOSTED_TOOLS = ("web_search", "web_fetch", "code_execution", "code_interpreter", "file_search", "image_generation",
                "mcp")


def hosted_tools(body: dict) -> list:
    """(index, type) of each tool of ``body`` the provider runs itself and bills per call (``HOSTED_TOOLS``)."""
    tools = body.get("tools")
    return [(i, t["type"]) for i, t in enumerate(tools if isinstance(tools, list) else [])
            if isinstance(t, dict) and isinstance(t.get("type"), str) and t["type"].startswith(HOSTED_TOOLS)]


def writes_cache(body: dict) -> str:
    """Whether a request asks its provider to write its prompt to a cache (Anthropic's ``cache_control`` on a block, a
    tool or the request), which bills that prompt above the input price: ``"1h"`` where any asks for the one-hour
    cache (``"ttl": "1h"``, billed higher), else ``"5m"``; ``""`` where none asks."""
    stack, found = [body], ""
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            control = v.get("cache_control")
            if control is not None:
                if isinstance(control, dict) and control.get("ttl") == "1h":
                    return "1h"
                found = "5m"
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return found


def as_missed(usage: dict, writes: str) -> dict:
    """Chat-words ``usage`` charged as if the provider's prompt cache had held nothing of the request: its cache reads
    counted as what a miss writes (``writes``: the lifetime the request asked, ``"5m"`` or ``"1h"``), or as plain input
    where it asked for no write. A cache a gateway's keys share at a hosted provider serves one key's hit from another
    key's write: charged so, a hit and a miss of the same prompt cost a key the same, and its spend tells it nothing of
    what others sent (the provider's bill, a read being the cheapest, is never above it)."""
    details = dict(usage.get("prompt_tokens_details") or {})
    read = _int(details.pop("cached_tokens", 0))
    if not read:
        return usage
    if writes:
        details["cache_write_tokens"] = _int(details.get("cache_write_tokens")) + read
        if writes == "1h":
            details["cache_write_1h_tokens"] = _int(details.get("cache_write_1h_tokens")) + read
    return {**usage, "prompt_tokens_details": details}


def _int(value) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 0


@dataclass
class Usage:
    """What an answer used, in every kind an upstream bills: ``input`` (at the input price: neither read from nor
    written to a prompt cache), ``cache_read`` and ``cache_write`` input, ``output`` (reasoning included) and of it
    ``reasoning``, and hosted tools' calls (``tool_calls``: tool -> calls). Read from and written in each protocol's
    words here, and nowhere else."""

    input: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cache_write_1h: int = 0  # of cache_write, what was written for an hour (Anthropic's one-hour cache)
    output: int = 0
    reasoning: int = 0
    tool_calls: dict = field(default_factory=dict)

    @property
    def prompt(self) -> int:
        """Every input token, cached or not."""
        return self.input + self.cache_read + self.cache_write

    # -- read: OpenAI counts cached input inside its prompt; Anthropic apart from its input_tokens
    @classmethod
    def of_chat(cls, u) -> "Usage | None":
        if not isinstance(u, dict) or ("prompt_tokens" not in u and "completion_tokens" not in u):
            return None
        cached = _int((u.get("prompt_tokens_details") or {}).get("cached_tokens"))
        prompt = _int(u.get("prompt_tokens"))
        return cls(input=max(prompt - cached, 0), cache_read=min(cached, prompt),
                   output=_int(u.get("completion_tokens")),
                   reasoning=_int((u.get("completion_tokens_details") or {}).get("reasoning_tokens")))

    @classmethod
    def of_responses(cls, u, output=None) -> "Usage | None":
        """``output``: the response's output items, where its hosted tools' calls are counted (a ``web_search_call``
        item each: the Responses API's usage has no field for them), under the item's type."""
        if not isinstance(u, dict) or "input_tokens" not in u:
            return None
        cached = _int((u.get("input_tokens_details") or {}).get("cached_tokens"))
        prompt = _int(u.get("input_tokens"))
        calls: dict = {}
        for item in output if isinstance(output, list) else ():
            kind = item.get("type") if isinstance(item, dict) else None
            if isinstance(kind, str) and kind.endswith("_call") and kind.startswith(HOSTED_TOOLS):
                calls[kind] = calls.get(kind, 0) + 1
        return cls(input=max(prompt - cached, 0), cache_read=min(cached, prompt), output=_int(u.get("output_tokens")),
                   reasoning=_int((u.get("output_tokens_details") or {}).get("reasoning_tokens")), tool_calls=calls)

    @classmethod
    def of_messages(cls, u) -> "Usage | None":
        if not isinstance(u, dict) or ("input_tokens" not in u and "output_tokens" not in u):
            return None
        tools = {k: _int(v) for k, v in (u.get("server_tool_use") or {}).items() if _int(v)}
        written = _int(u.get("cache_creation_input_tokens"))
        by_ttl = u.get("cache_creation") if isinstance(u.get("cache_creation"), dict) else {}
        return cls(input=_int(u.get("input_tokens")), cache_read=_int(u.get("cache_read_input_tokens")),
                   cache_write=written, cache_write_1h=min(_int(by_ttl.get("ephemeral_1h_input_tokens")), written),
                   output=_int(u.get("output_tokens")), tool_calls=tools)

    @classmethod
    def of_any(cls, u) -> "Usage | None":
        """A usage object in whichever API's words it comes (an endpoint relayed as it is): chat's
        (``prompt_tokens``), the Responses API's (``input_tokens`` with ``total_tokens`` or its details) or Messages'."""
        if not isinstance(u, dict):
            return None
        if "prompt_tokens" in u or "completion_tokens" in u:
            return cls.of_chat(u)
        if "input_tokens" in u and ("total_tokens" in u or "input_tokens_details" in u):
            return cls.of_responses(u)
        return cls.of_messages(u)

    @staticmethod
    def without_cache_detail(obj: dict) -> dict:
        """An answer, chunk or event whose usage (in any API's words, where it has one) shows nothing of a provider's
        prompt cache: the tokens read from it and those written to it counted as plain input — what a key is shown of
        a cache it shares with every key of the gateway (a read is another key's prefix; a write, that none had sent
        it). A hit and a miss of the same prompt show the same usage. The charge reads the usage before this."""
        def plain(u):
            if not isinstance(u, dict):
                return u
            u = dict(u)
            if isinstance(u.get("prompt_tokens_details"), dict):  # chat: cached_tokens are inside prompt_tokens
                u["prompt_tokens_details"] = {k: v for k, v in u["prompt_tokens_details"].items() if k != "cached_tokens"}
            if isinstance(u.get("input_tokens_details"), dict):  # Responses: inside input_tokens
                u["input_tokens_details"] = {**u["input_tokens_details"], "cached_tokens": 0}
            u.pop("cache_creation", None)  # Messages: the write's split by lifetime
            for beside in ("cache_read_input_tokens", "cache_creation_input_tokens"):  # Messages: beside input_tokens
                if beside in u:
                    u["input_tokens"] = _int(u.get("input_tokens")) + _int(u.pop(beside))
            return u

        if not isinstance(obj, dict):
            return obj
        out = {**obj, "usage": plain(obj["usage"])} if "usage" in obj else obj
        for inner in ("response", "message"):
            if isinstance(out.get(inner), dict) and "usage" in out[inner]:
                out = {**out, inner: {**out[inner], "usage": plain(out[inner]["usage"])}}
        return out

    def merged(self, other: "Usage | None") -> "Usage":
        """The larger of each count (a Messages stream tells its input in its first event, its output in its last)."""
        if other is None:
            return self
        tools = {k: max(self.tool_calls.get(k, 0), other.tool_calls.get(k, 0))
                 for k in {*self.tool_calls, *other.tool_calls}}
        return Usage(max(self.input, other.input), max(self.cache_read, other.cache_read),
                     max(self.cache_write, other.cache_write), max(self.cache_write_1h, other.cache_write_1h),
                     max(self.output, other.output), max(self.reasoning, other.reasoning), tools)

    # -- written
    def chat(self) -> dict:
        """In chat's words, as prices read them (``PriceSpec.cost``): cache writes as
        ``prompt_tokens_details.cache_write_tokens`` and hosted tools' calls as ``server_tool_use``, which chat has no
        field for."""
        out = {"prompt_tokens": self.prompt, "completion_tokens": self.output, "total_tokens": self.prompt + self.output}
        details = {k: v for k, v in (("cached_tokens", self.cache_read), ("cache_write_tokens", self.cache_write),
                                     ("cache_write_1h_tokens", self.cache_write_1h)) if v}
        if details:
            out["prompt_tokens_details"] = details
        if self.reasoning:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning}
        if self.tool_calls:
            out["server_tool_use"] = dict(self.tool_calls)
        return out

    def responses(self) -> dict:
        return {"input_tokens": self.prompt, "input_tokens_details": {"cached_tokens": self.cache_read},
                "output_tokens": self.output, "output_tokens_details": {"reasoning_tokens": self.reasoning},
                "total_tokens": self.prompt + self.output}

    def messages(self) -> dict:
        out = {"input_tokens": self.input, "output_tokens": self.output}
        if self.cache_read:
            out["cache_read_input_tokens"] = self.cache_read
        if self.cache_write:
            out["cache_creation_input_tokens"] = self.cache_write
            if self.cache_write_1h:
                out["cache_creation"] = {"ephemeral_5m_input_tokens": self.cache_write - self.cache_write_1h,
                                         "ephemeral_1h_input_tokens": self.cache_write_1h}
        if self.tool_calls:
            out["server_tool_use"] = dict(self.tool_calls)
        return out
