"""The one spec of a pool model and the one sampling spec, used by the evaluation job (``models:`` of a job config), the served app
(``models:`` of the Serve app args) and the monitor's job template: its id, engine and engine arguments, its price
per million input and output tokens (with the one cost function), where it runs, and how it scales.

Earlier spellings still load, with a warning that names the field to write instead: ``price_in`` / ``price_out``
(now ``price: {input_per_mtok, output_per_mtok}``) and ``gpus_per_replica`` (now ``num_gpus``)."""
from __future__ import annotations

import warnings
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from proxray.common.pricing import token_cost
from proxray.common.yamlconfig import StrictModel

ENGINES = ("vllm", "transformers", "sim", "openai")
# the client protocols an endpoint may serve itself (``proxray.serve.protocols`` holds one row for each)
PROTOCOLS = ("chat", "completions", "responses", "messages")
EARLIER = {"price_in", "price_out", "gpus_per_replica", "responses_api", "messages_api"}  # spellings still read


class Sampling(StrictModel):
    """How a model generates: the evaluation job's ``sampling:`` (part of each row's fingerprint, so a change re-runs
    every pair) and, per request, what a served model is asked for."""

    model_config = ConfigDict(frozen=True)
    temperature: float = Field(0.0, ge=0, allow_inf_nan=False, description="0 = greedy")
    max_tokens: int = Field(64, ge=1, description="the answer's token limit")
    seed: int = Field(42, description="sampling seed")
    top_p: float = Field(1.0, ge=0, le=1, description="nucleus sampling: the probability mass sampled from")


# of the input price, where a config gives none (providers' lists): cache reads, 5-minute and one-hour cache writes
CACHE_READ_RATIO, CACHE_WRITE_RATIO, CACHE_WRITE_1H_RATIO = 0.1, 1.25, 2.0
# price multipliers by the service tier an answer reports (OpenAI's list for its GPT-5 models), where a config gives none
SERVICE_TIERS = {"priority": 2.0, "flex": 0.5}


class LongContext(StrictModel):
    """A price tier above a prompt size: every token of a request whose prompt is larger is billed higher."""

    above_tokens: int = Field(gt=0, description="prompt tokens (cached or not) past which the tier applies")
    input_multiplier: float = Field(2.0, ge=1, allow_inf_nan=False, description="of every input price (Anthropic's: 2)")
    output_multiplier: float = Field(1.5, ge=1, allow_inf_nan=False, description="of the output price (Anthropic's: 1.5)")


class PriceSpec(StrictModel):
    """A model's token prices, USD per million tokens (as providers list them), and what else its provider bills."""

    input_per_mtok: float = Field(ge=0, allow_inf_nan=False, description="USD per million prompt tokens")
    output_per_mtok: float = Field(ge=0, allow_inf_nan=False, description="USD per million completion tokens")
    cache_read_per_mtok: float | None = Field(None, ge=0, allow_inf_nan=False, description=(
        f"USD per million prompt tokens read from the provider's prompt cache; default {CACHE_READ_RATIO:g} × "
        "input_per_mtok (Anthropic's cache reads, OpenAI's cached input on its current models; set it for a model "
        "billed otherwise, e.g. 0.5 × input for OpenAI's older ones)"))
    cache_write_per_mtok: float | None = Field(None, ge=0, allow_inf_nan=False, description=(
        f"USD per million prompt tokens written to the provider's prompt cache; default {CACHE_WRITE_RATIO:g} × "
        "input_per_mtok (Anthropic's 5-minute cache; 2 × for its 1-hour one)"))
    cache_write_1h_per_mtok: float | None = Field(None, ge=0, allow_inf_nan=False, description=(
        f"USD per million prompt tokens written to the provider's one-hour prompt cache (a block whose cache_control "
        f"asks \"ttl\": \"1h\"); default {CACHE_WRITE_1H_RATIO:g} × input_per_mtok (Anthropic's)"))
    cache_ttl_s: float = Field(300.0, gt=0, allow_inf_nan=False, description=(
        "how long the provider keeps a prompt in its cache after its last use (300: Anthropic's default 5-minute cache "
        "and OpenAI's in-memory one; 3600 for Anthropic's 1-hour cache): a conversation's next turn within it is "
        "expected to read its prefix at cache_read_per_mtok"))
    cache_min_tokens: int = Field(1024, ge=0, description=(
        "the shortest prompt the provider caches (1024 for Anthropic's Sonnet and Opus and for OpenAI; 2048 for "
        "Anthropic's Haiku; 0 for a co-hosted vLLM model's prefix cache)"))
    audio_input_per_mtok: float | None = Field(None, ge=0, allow_inf_nan=False, description=(
        "USD per million audio prompt tokens (chat's prompt_tokens_details.audio_tokens); none: the model takes no "
        "audio a budgeted key sends it"))
    audio_output_per_mtok: float | None = Field(None, ge=0, allow_inf_nan=False, description=(
        "USD per million audio completion tokens (completion_tokens_details.audio_tokens, what `modalities: "
        "[text, audio]` asks for); none: a budgeted key may not ask the model for audio"))
    long_context: LongContext | None = Field(None, description=(
        "a price tier above a prompt size, e.g. {above_tokens: 200000} for Anthropic's 1M-token context (input 2×, "
        "output 1.5× for a prompt over 200,000 tokens, which the model only takes with that tier); none: one price"))
    service_tiers: dict[str, float] = Field(SERVICE_TIERS, description=(
        "price multiplier by the service tier an answer reports (OpenAI's service_tier); a request that asks a tier "
        "is held at its multiplier; default {priority: 2.0, flex: 0.5}"))
    tool_call_usd: dict[str, float] = Field({}, description=(
        "USD per call of a hosted tool the provider runs and bills apart, by the name its usage counts it under, e.g. "
        "{web_search_requests: 0.01} (Anthropic's web search: 10 USD per 1,000); through the Responses API, by its "
        "output item's type, e.g. {web_search_call: 0.01}"))

    def tokens(self, input_tokens, output_tokens):
        """USD for these token counts (numbers or arrays): ``common.pricing.token_cost``."""
        return token_cost(input_tokens, output_tokens, self.input_per_mtok, self.output_per_mtok)

    def bound(self, prompt_tokens: int, completion_tokens: int, writes_cache: str = "", tier: str = "",
              audio: bool = False) -> float:
        """USD these tokens can cost at most: the prompt at the input price — at the cache-write price where the request
        asks the provider to cache it (``writes_cache``: Anthropic's ``cache_control``, ``"5m"`` or ``"1h"``), which
        costs more — and the completion at the output price; at the long-context tier's above its size, and at the
        service ``tier``'s multiplier where it asks one that costs more; the completion at the audio output price where
        it asks for ``audio``."""
        prompt_price = max(self.input_per_mtok, self.write_price(writes_cache)) if writes_cache else self.input_per_mtok
        output_price = max(self.output_per_mtok, self.audio_output_per_mtok or 0.0) if audio else self.output_per_mtok
        m_in, m_out = self._tier_multipliers(prompt_tokens, tier)
        return (prompt_tokens * prompt_price * max(m_in, 1.0) + completion_tokens * output_price
                * max(m_out, 1.0)) / 1e6

    def _tier_multipliers(self, prompt_tokens: int, tier) -> tuple[float, float]:
        """(input, output) price multipliers of a request with ``prompt_tokens`` answered at service ``tier``."""
        m = self.service_tiers.get(tier, 1.0) if isinstance(tier, str) else 1.0
        lc = self.long_context
        if lc is not None and prompt_tokens > lc.above_tokens:
            return m * lc.input_multiplier, m * lc.output_multiplier
        return m, m

    def read_price(self) -> float:
        """USD per million prompt tokens read from the cache."""
        return self.cache_read_per_mtok if self.cache_read_per_mtok is not None else CACHE_READ_RATIO * self.input_per_mtok

    def write_price(self, ttl: str = "5m") -> float:
        """USD per million prompt tokens written to the cache (``ttl``: ``"1h"``, the one-hour cache)."""
        if ttl == "1h":
            return (self.cache_write_1h_per_mtok if self.cache_write_1h_per_mtok is not None else
                    CACHE_WRITE_1H_RATIO * self.input_per_mtok)
        return (self.cache_write_per_mtok if self.cache_write_per_mtok is not None else
                CACHE_WRITE_RATIO * self.input_per_mtok)

    def cost(self, usage) -> float | None:
        """USD of one answer from its ``usage`` in chat's words: ``prompt_tokens`` (of them, cache reads in
        ``prompt_tokens_details.cached_tokens`` and writes in ``prompt_tokens_details.cache_write_tokens``, of them
        ``cache_write_1h_tokens`` for the one-hour cache, each at its price), ``completion_tokens``, and hosted tools'
        calls (``server_tool_use``); audio tokens (``audio_tokens`` of either's details) at the audio prices; every
        token at the long-context tier's multipliers above its size and at the
        ``service_tier`` multiplier the answer reports (``service_tiers``). None without usable token counts."""
        if not isinstance(usage, dict):
            return None
        p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in (p, c)):
            return None
        details = usage.get("prompt_tokens_details") or {}
        read = min(_count(details.get("cached_tokens")), p)
        written = min(_count(details.get("cache_write_tokens")), p - read)
        hour = min(_count(details.get("cache_write_1h_tokens")), written)  # of the writes, the one-hour cache's
        m_in, m_out = self._tier_multipliers(p, usage.get("service_tier"))
        heard = min(_count(details.get("audio_tokens")), p - read - written)  # audio in the prompt, uncached
        spoken = min(_count((usage.get("completion_tokens_details") or {}).get("audio_tokens")), c)
        audio_in = self.audio_input_per_mtok if self.audio_input_per_mtok is not None else self.input_per_mtok
        audio_out = self.audio_output_per_mtok if self.audio_output_per_mtok is not None else self.output_per_mtok
        usd = ((p - read - written - heard) * self.input_per_mtok + heard * audio_in + read * self.read_price()
               + (written - hour) * self.write_price() + hour * self.write_price("1h")) * m_in / 1e6 \
            + ((c - spoken) * self.output_per_mtok + spoken * audio_out) * m_out / 1e6
        tools = usage.get("server_tool_use") or {}
        return usd + sum(_count(n) * self.tool_call_usd.get(name, 0.0) for name, n in tools.items())


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class AutoscalingSpec(StrictModel):
    """Ray Serve ``autoscaling_config`` keys, checked (Serve itself lets a misspelt key pass)."""

    min_replicas: int = Field(1, ge=0, description="fewest replicas (0: none while no request comes)")
    max_replicas: int = Field(2, ge=1, description="most replicas routed load may start")
    initial_replicas: int | None = Field(None, ge=0, description="replicas at deploy time; default min_replicas")
    target_ongoing_requests: float = Field(2.0, gt=0, description=(
        "requests in flight per replica that Serve aims for: more load than this starts replicas"))
    upscale_delay_s: float = Field(2.0, ge=0, description="how long load must stay high before a replica is added")
    downscale_delay_s: float = Field(10.0, ge=0, description="how long load must stay low before a replica is removed")
    metrics_interval_s: float | None = Field(None, gt=0, description="how often replicas report load; default Serve's")
    look_back_period_s: float | None = Field(None, gt=0, description="the window load is averaged over; default Serve's")


class RateLimit(StrictModel):
    """What an endpoint allows one model, across all of its workers in one job."""

    requests_per_minute: float | None = Field(None, gt=0, description="requests started in any minute, at most")
    tokens_per_minute: float | None = Field(None, gt=0, description="prompt + completion tokens in any minute, at "
                                            "most (a request reserves its prompt estimate + max_tokens)")


class PoolModel(StrictModel):
    """One model of the pool, wherever it runs."""

    id: str = Field(min_length=1, description="the model's name in tables, router artifacts and responses")
    engine: Literal[ENGINES] = Field(description="vllm (GPU nodes, or the CPU build), transformers (CPU), sim "
                                     "(the synthetic world's simulated models), openai (an OpenAI-compatible endpoint "
                                     "proxray does not host: a hosted API, or a vLLM / SGLang / TGI server)")
    source: str | None = Field(None, description="weights: Hub id or local folder; openai: the model's name at the "
                               "endpoint (default: id)")
    base_url: str | None = Field(None, description="openai: the endpoint, e.g. https://api.example.com/v1")
    api_key_env: str | None = Field(None, description="openai: the environment variable (on the workers) holding "
                                    "its key; never in a config, a log, a table or an artifact")
    api_key_file: str | None = Field(None, description="openai: a file (on the workers) whose first line is its key")
    rate_limit: RateLimit | None = Field(None, description="openai: what the endpoint allows, kept across all of "
                                         "the model's workers in a job (one limiter)")
    protocols: list[Literal[PROTOCOLS]] = Field(["chat", "completions"], description=(
        "openai, served: the client protocols the endpoint serves itself, relayed to it as sent — chat and "
        "completions (every OpenAI-compatible endpoint), responses (/v1/responses: OpenAI's API, vLLM's server), "
        "messages (Anthropic's /v1/messages and count_tokens: Anthropic's API, vLLM's server; relayed with the "
        "client's anthropic-version and anthropic-beta headers and the key also as x-api-key); a protocol it does not "
        "serve reaches it translated to chat completions. The evaluation job uses its chat completions either way (earlier "
        "spelt responses_api / messages_api: true, still read)"))
    timeout_s: float = Field(60.0, gt=0, description="openai: seconds one request may take")
    max_concurrency: int = Field(8, ge=1, description="openai: requests in flight per worker at most")
    max_retries: int = Field(4, ge=0, description="openai: retries of a request after a 429, a 5xx or a dropped "
                                                  "connection (backoff, Retry-After honoured); never after another 4xx")
    engine_kwargs: dict = Field(default_factory=dict, description="arguments of the engine (vLLM: EngineArgs "
                                "fields; transformers and sim: their own)")
    price: PriceSpec | None = Field(None, description="token prices; the evaluation job needs them (it prices every "
                                    "answer), serving needs them for budget.basis: realised")
    accelerator_type: str | None = Field(None, description="node accelerator each replica needs, e.g. H100, A100 "
                                         "(Ray's names; the job checks it against the cluster before it starts)")
    num_cpus: float | None = Field(None, gt=0, description="CPUs per replica; default 1 in the evaluation job, 0.1 "
                                   "when served. vllm in the job: CPUs per actor of the processor's chat-template, "
                                   "tokenize and detokenize stages")
    num_gpus: float | None = Field(None, ge=0, description="GPUs per replica; default 1 for vllm, 0 otherwise; vllm "
                                   "runs tensor parallel when > 1 (unless engine_kwargs says otherwise)")
    placement_group_config: dict | None = Field(
        None, description="vllm: Ray placement bundles per engine, e.g. {bundles: [{CPU: 0.1}]} on a CPU machine")
    runtime_env: dict | None = Field(None, description="Ray runtime_env of the engine's workers (env_vars, pip: a "
                                     "torch built for older GPUs, ...); in the job every engine, served: vllm")
    replicas: int = Field(1, ge=1, description="evaluation job: engines working through the queries at once")
    batch_size: int = Field(16, ge=1, description="evaluation job: queries per batch")
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec, description="serving: the deployment's "
                                         "Ray Serve autoscaling_config (not openai: the router's replicas relay it)")
    max_ongoing_requests: int | None = Field(
        None, ge=1, description="serving, per replica; default 8 for the CPU engines, ray.serve.llm's own for vllm; "
        "openai: requests in flight to the endpoint per router replica (default 64; past it a 429, which falls back)")
    max_queued_requests: int = Field(256, ge=1, description="serving, per deployment; past it a call fails fast "
                                     "(the next model is tried)")
    max_replicas_per_node: int | None = Field(None, ge=1, description="serving: at most this many replicas on one "
                                              "node (1: scaling out goes to other nodes)")

    @model_validator(mode="before")
    @classmethod
    def _earlier_spellings(cls, data):
        """``price_in`` / ``price_out``, ``gpus_per_replica`` and ``responses_api`` / ``messages_api``, as configs
        wrote them before."""
        if not isinstance(data, dict) or not (EARLIER & set(data)):
            return data
        data = dict(data)
        where = f"model {data.get('id')!r}: "
        flags = {name: protocol for name, protocol in (("responses_api", "responses"), ("messages_api", "messages"))
                 if name in data}
        if flags:
            if "protocols" in data:
                raise ValueError(f"{where}give protocols, or the earlier {' / '.join(flags)}, not both")
            served = ["chat", "completions"] + [p for name, p in flags.items() if data.pop(name)]
            data["protocols"] = served
            warnings.warn(f"{where}{' / '.join(flags)} are deprecated: write protocols: [{', '.join(served)}]",
                          FutureWarning, stacklevel=2)
        if "price_in" in data or "price_out" in data:
            if "price" in data:
                raise ValueError(f"{where}give price, or the earlier price_in / price_out, not both")
            data["price"] = {"input_per_mtok": data.pop("price_in", None), "output_per_mtok": data.pop("price_out", None)}
            warnings.warn(f"{where}price_in / price_out are deprecated: write price: {{input_per_mtok: ..., "
                          "output_per_mtok: ...}", FutureWarning, stacklevel=2)
        if "gpus_per_replica" in data:
            if "num_gpus" in data:
                raise ValueError(f"{where}give num_gpus, or the earlier gpus_per_replica, not both")
            data["num_gpus"] = data.pop("gpus_per_replica")
            warnings.warn(f"{where}gpus_per_replica is deprecated: write num_gpus", FutureWarning, stacklevel=2)
        return data

    @model_validator(mode="after")
    def _endpoint(self):
        endpoint = ("base_url", "api_key_env", "api_key_file", "rate_limit")
        if self.engine != "openai" and set(self.protocols) != {"chat", "completions"}:
            raise ValueError(f"model {self.id!r}: protocols belong to engine openai (a co-hosted {self.engine} model "
                             "serves chat and completions; the gateway translates the rest)")
        if self.engine == "openai":
            if not self.base_url or not self.base_url.startswith(("http://", "https://")):
                raise ValueError(f"model {self.id!r}: engine openai needs base_url: http(s)://host[:port]/v1 (got "
                                 f"{self.base_url!r})")
            if self.api_key_env and self.api_key_file:
                raise ValueError(f"model {self.id!r}: give api_key_env or api_key_file, not both")
        elif any(getattr(self, f) not in (None, False) for f in endpoint):
            given = [f for f in endpoint if getattr(self, f) not in (None, False)]
            raise ValueError(f"model {self.id!r}: {', '.join(given)} belong to engine openai, not {self.engine}")
        return self

    def serves(self, protocol: str) -> bool:
        """Whether the model's endpoint serves the client protocol ``protocol`` itself (relayed as sent)."""
        return protocol in self.protocols

    @property
    def gpus(self) -> float:
        """GPUs each replica asks Ray for: ``num_gpus``, else 1 for vllm and 0 for the CPU engines."""
        return self.num_gpus if self.num_gpus is not None else float(self.engine == "vllm")

    def replica_gpus(self) -> float:
        """GPUs one replica (one engine) takes: the GPUs of its placement bundles where it names them; for vllm else
        ``num_gpus``, else tensor × pipeline parallel size (1 by default); for the CPU engines ``gpus``."""
        bundles = (self.placement_group_config or {}).get("bundles") or []
        if bundles:
            return float(sum(b.get("GPU", 0) for b in bundles))
        if self.engine == "vllm" and self.num_gpus is None:
            kw = self.engine_kwargs
            return float((kw.get("tensor_parallel_size") or 1) * (kw.get("pipeline_parallel_size") or 1))
        return self.gpus

    def cpus(self, default: float) -> float:
        return self.num_cpus if self.num_cpus is not None else default

    def cost(self, input_tokens, output_tokens):
        """USD of answers with these token counts at this model's price (the one cost function)."""
        if self.price is None:
            raise ValueError(f"model {self.id!r} has no price")
        return self.price.tokens(input_tokens, output_tokens)
