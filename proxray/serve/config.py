"""The Serve application's configuration, validated at the YAML boundary: ``AppArgs`` (the app's ``args``) and the
settings it holds — the served models (the one pool-model spec), model aliases, the served budget, conversations,
feedback and stored responses. On ``proxray.serve``'s ground floor: every room of the app reads it, none is read by it."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from proxray.common.yamlconfig import StrictModel
from proxray.pool.spec import PoolModel

ROUTER_MODEL = "proxray"  # the model name that asks for routing
ROUTING_TEXT = ("system+last_user", "last_user", "all_user", "all")  # what the router embeds (protocols.base.text_of)


class BudgetSpec(StrictModel):
    """A cost target instead of a fixed λ: each ingress replica adjusts λ online."""
    cost_per_query: float = Field(gt=0, description="USD: target mean cost of routed requests")
    basis: Literal["estimated", "realised"] = Field("estimated", description=(
        "what is kept on target: the router's estimated cost of the chosen model (known when routing), or "
        "the realised cost of each answer, its usage tokens at the answering model's price (models[].price; "
        "an answer without usage, e.g. a stream without stream_options.include_usage, counts its estimate)"))
    window: int = Field(100, ge=1, le=100000, description="about how many recent requests the mean covers")
    gain: float = Field(0.05, gt=0, le=1, description="how fast λ follows the recent mean (log-space step)")
    lam0: float | None = Field(None, gt=0, description="starting λ; default 0.1 / cost_per_query")


ServedModel = PoolModel  # one model deployment of the app: the one pool-model spec (proxray.pool.spec)


class ModelAlias(StrictModel):
    """What a model name a client asks for means (``model_aliases``): routing, with its own λ and models, or a pool
    model. Precedence: the request's own ``proxray`` options, then the alias's, then its key's, then the app's."""
    model: str = Field(ROUTER_MODEL, min_length=1, description="proxray (routed) or a served model's id")
    lam: float | None = Field(None, ge=0, description="λ of the requests that name it (routed)")
    allowed_models: list[str] | None = Field(None, min_length=1, description="the models its requests are routed "
                                             "among (within the key's)")


def resolve_alias(name: str, aliases: dict) -> tuple[str, ModelAlias | None]:
    """(the model a request names, its alias or None): ``name`` looked up in ``aliases`` as it is, else against each
    alias that is a glob pattern (``claude-*``), in the config's order."""
    import fnmatch

    alias = aliases.get(name)
    if alias is None:
        alias = next((a for pattern, a in aliases.items() if any(c in pattern for c in "*?[") and
                      fnmatch.fnmatchcase(name, pattern)), None)
    return (alias.model, alias) if alias is not None else (name, None)


class ConversationSpec(StrictModel):
    """``conversations:`` of the app args."""

    rule: Literal["cache_aware", "margin"] = Field("cache_aware", description=(
        "how a conversation keeps its model: cache_aware — each model's cost of a turn is what this turn is expected to "
        "be billed there (its prompt, the part that model's prompt cache holds from the conversation's last turn there "
        "at the cache-read price, the expected output), so it switches only where another model's gain beats the "
        "cache it gives up; margin — the router's table estimates and a fixed margin (escalate_margin, "
        "step_down_margin)"))
    switch_horizon_turns: float = Field(2.0, ge=1, allow_inf_nan=False, description=(
        "rule cache_aware: the turns a switch is expected to last — moving a conversation to a model whose cache does "
        "not hold it bills its prefix in full once, and the decision spreads that over this many turns (1: all of it "
        "on the turn that switches, the most reluctant)"))
    escalate_margin: float = Field(0.02, ge=0, description="rule margin: switch to a model with higher estimated accuracy when "
                                   "its objective beats the conversation's model by more than this")
    step_down_margin: float = Field(0.05, ge=0, description="rule margin: switch to a model with lower estimated accuracy (a "
                                    "cheaper one) only when its objective is better by more than this")
    ttl_s: float = Field(3600.0, gt=0, description="a conversation idle this long is forgotten (its next turn is new)")
    max_entries: int = Field(100_000, ge=1, description="conversations remembered at most (least recently used "
                             "dropped first; ~200 bytes each)")
    key_share: float = Field(0.25, gt=0, le=1, description="the part of max_entries one key of the keys file may hold: "
                             "past it, that key's own least recently used conversation is dropped, never another "
                             "key's (1: no share)")


class FeedbackSpec(StrictModel):
    """``feedback:`` of the app args."""

    enabled: bool = Field(True, description="remember answers and accept POST /v1/feedback on them (off: ~0.4-0.5 ms "
                          "less at a pass-through's p95, for apps whose clients never score answers)")
    retention_s: float = Field(86400.0, gt=0, description="feedback is accepted this long after the answer")
    max_answers: int = Field(20_000, ge=1, description="answers remembered at most, the oldest dropped first "
                             "(~13 kB each with a 400-character routing text, measured)")
    max_bytes: int = Field(256 * 2**20, ge=2**20, description="bytes of routing text (as held in memory, plus "
                           f"{2**10} per answer) the book holds at most, the oldest answers dropped first")
    key_share: float = Field(0.5, gt=0, le=1, description="the share of max_bytes and max_answers one API key's answers "
                             "may take: past it, that key's own oldest answers are dropped, not another key's")


class ResponsesSpec(StrictModel):
    """``responses:`` of the app args: the stored responses (``GET /v1/responses/{id}``, ``previous_response_id``)."""

    store: bool = Field(True, description="keep responses whose request did not say store: false, for retrieval and "
                        "previous_response_id; false: nothing is kept (every response says store: false)")
    hosted_tools: Literal["drop", "refuse"] = Field("drop", description="a hosted tool (web_search, file_search, …) "
                                                    "offered to a model that answers through chat completions, which "
                                                    "cannot run it: drop (default; left out, named in the answer's "
                                                    "dropped: Codex offers web_search on every request) or refuse (a "
                                                    "400 naming it for that model)")
    retention_s: float = Field(86400.0, gt=0, description="a stored response is kept this long after it was created "
                               "or last continued (previous_response_id)")
    max_responses: int = Field(20_000, ge=1, description="stored responses at most, the least recently used dropped "
                               "first")
    max_bytes: int = Field(256 * 2**20, ge=2**20, description="bytes the stored responses hold at most (their JSON as "
                           "held in memory, plus 1024 each), the least recently used dropped first")
    key_share: float = Field(0.5, gt=0, le=1, description="the share of max_bytes and max_responses one API key's "
                             "responses may take: past it, that key's own least recently used responses are dropped; "
                             "a response larger than it alone is answered unstored (store: false)")
    max_history_items: int = Field(1000, ge=1, description="responses one previous_response_id chain may hold: a "
                                   "longer conversation is refused (400 naming the limit) instead of rebuilt")
    max_history_bytes: int = Field(8 * 2**20, ge=2**16, description="bytes of JSON one previous_response_id chain may "
                                   "hold: past it, 413 naming the limit (rebuilding it would hold the event loop)")


class ResponseCacheSpec(StrictModel):
    """``response_cache:`` of the app args: answers served again to a repeated request (exact) or a paraphrase of one
    (semantic), within the asking key's scope (``proxray.serve.stages.cache``; docs/guides/serve.md)."""

    exact: bool = Field(True, description="answer a request that repeats a cached one (the same model, the same "
                        "request as sent, JSON order and whitespace aside) from the cache")
    semantic: bool = Field(True, description="answer a request whose ask is a cached request's written otherwise — in "
                           "other case, runs of spaces or sentence-ending punctuation — the rest of the request the "
                           "same, from the cache (and, with similarity, one whose routing embedding is that close)")
    similarity: float | None = Field(None, gt=0, le=1, description=(
        "also answer a routed request from the cached request whose routing embedding is nearest, where their cosine "
        "similarity reaches this; off by default: on the shipped tables even 0.995 answers 1,041 of 26,727 distinct "
        "questions with another's answer (the shipped MiniLM reads 256 tokens; bench/bench_cache.py)"))
    max_user_turns: int = Field(1, ge=1, description="requests with more user turns than this are not cached")
    deterministic_only: bool = Field(True, description="only requests with temperature 0 or a seed are cached")
    ttl_s: float = Field(3600.0, gt=0, description="a cached answer is served this long after it was kept")
    max_entries: int = Field(50_000, ge=1, description="cached answers at most, the least recently used dropped first")
    max_bytes: int = Field(256 * 2**20, ge=2**20, description="bytes of cached answers (their JSON, plus 1024 each) "
                           "at most, the least recently used dropped first")
    scope_share: float = Field(0.25, gt=0, le=1, description="the share of max_entries and max_bytes one scope (a "
                               "key, or a keys-file cache group) may take: past it, that scope's own least recently "
                               "used answers are dropped, never another scope's")


class AppArgs(StrictModel):
    """``args`` of the Serve application (``import_path: proxray.serve.app:build_app``)."""

    router: str = Field(description="router artifact: a folder every node reads, or a URI (s3://bucket/routers/r; "
                        "proxray fit --out / KNNRouter.save); each replica caches its arrays by checksum")
    encoder: str | None = Field(None, description=(
        "sentence-transformers name or path, or static (a static encoder distilled from the shipped MiniLM, "
        "0.1–0.4 ms a text; static:PATH from another local model); must be the encoder the router was fitted "
        "with; default: shipped MiniLM"))
    encoder_backend: Literal["torch", "onnx", "onnx-int8"] = Field("onnx", description=(
        "how the ingress runs the encoder: onnx = the same model exported to ONNX Runtime (equal output, "
        "~3x faster; exported on first start into the proxray cache), torch = sentence-transformers, "
        "onnx-int8 = int8 weights (an approximation; see bench/bench_encoder.py)"))
    encoder_threads: int | None = Field(None, ge=1, description="ONNX Runtime threads; default min(2, CPUs)")
    embedding_cache_entries: int = Field(10000, ge=0, description=(
        "LRU of routing-text embeddings in each ingress replica (~1.7 KB each); 0 = off"))
    embed_batch_wait_s: float = Field(0.0, ge=0, le=0.1, description=(
        "how long the encoder, once free, waits for more routed requests before its next pass; "
        "0 = take what is queued"))
    models: list[ServedModel] = Field(min_length=1, description=(
        "the pool's model deployments (the pool-model spec): the router's models, and any other to pass through to"))
    new_models: list[str] = Field([], description=(
        "models of `models` the router does not know yet: served by name (pass-through) until the drift monitor "
        "adds them to the router; any other served model must be one the router knows"))
    simulate: bool = Field(False, description=(
        "a rehearsal: every model answers with the simulated engine under its own id (a model the simulated world "
        "does not know gets a generic profile), keeping its price, autoscaling and resources (accelerator type, "
        "GPUs); `proxray serve --simulate` sets it"))
    lam: float = Field(0.0, ge=0, description="default λ when a request gives none (and no budget is set)")
    budget: BudgetSpec | None = Field(None, description=(
        "route to a budget instead of a fixed λ: λ is adjusted online so that the mean cost (estimated, or "
        "realised: budget.basis) of recent routed requests meets budget.cost_per_query"))
    api_key_env: str | None = Field(None, description="env var holding the bearer token; unset = no auth")
    api_key_file: str | None = Field(None, description=(
        "file holding the bearer token (its first line), present on every node (~ is each node's home): keeps the "
        "key out of runtime_env, the Serve config and process environments; exclusive with api_key_env"))
    keys_file: str | None = Field(None, description=(
        "a file (on every node) of API keys with their own policy — λ, allowed models, request rate, budget — held as "
        "SHA-256 hashes and read again when it changes (proxray.serve.tenancy.keys; `proxray keys new` adds one); beside "
        "api_key_file / api_key_env, whose key stays unrestricted"))
    keys_ledger_shards: int = Field(1, ge=1, le=64, description=(
        "keys ledgers the keys file's keys are split over by the hash of their name (each key kept whole by one, so "
        "its rate and budget stay exact): one carries ~600-900 keyed requests a second (docs/guides/serve.md); a "
        "changed count carries every key's spend over"))
    timeout_s: float = Field(30.0, gt=0, description=(
        "one deadline per request across fallbacks: for the whole answer, or a stream's first chunk"))
    failover_s: float = Field(1.0, gt=0, le=60, description=(
        "a model deployment that has not taken a request, or has said nothing (not even its heartbeat, sent every "
        "0.25 s while it works) for this long, is passed over for the next candidate: its replica is lost, starting "
        "or full. A slow model is never cut off (it took the request and its heartbeat goes on); a request's last "
        "candidate is waited for while it has a live replica, else 503 with Retry-After (docs/operations/reliability.md)"))
    max_prompt_chars: int = Field(32000, ge=1, description="limit on the routing text (413 past it)")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="request body limit, checked before parsing (413)")
    default_max_tokens: int = Field(256, ge=1, description="added when a request sets no token limit")
    routing_text: Literal[ROUTING_TEXT] = Field("last_user", description=(
        "what the router embeds, for every API: last_user (the user's ask: the last user turn with text of its own — "
        "a turn that only returns tool results is not one — so an agent harness's system prompt, repeated on every "
        "request, neither drowns the ask nor counts toward max_prompt_chars), system+last_user, all_user or all"))
    model_aliases: dict[str, ModelAlias] = Field({}, description=(
        "model names clients ask for, mapped to routing or to a pool model: {claude-haiku-*: {model: proxray, "
        "allowed_models: [small]}, claude-*: {model: proxray, lam: 10}} — a name as it is, else the first glob that "
        "matches (the narrower glob first); so Claude Code or any client with its own model ids needs only the base "
        "URL"))
    conversations: ConversationSpec = Field(default_factory=ConversationSpec, description=(
        "requests naming a conversation keep its model across turns unless another's gain beats the prompt cache "
        "the switch gives up (rule cache_aware, the default) or a fixed margin (rule margin) "
        "(proxray.serve.tenancy.conversations)"))
    feedback: FeedbackSpec = Field(default_factory=FeedbackSpec, description=(
        "answers remembered so that POST /v1/feedback can score them; the monitor learns from the scores "
        "(proxray.serve.tenancy.feedback)"))
    responses: ResponsesSpec = Field(default_factory=ResponsesSpec, description=(
        "stored responses of POST /v1/responses, shared by every ingress replica: GET /v1/responses/{id}, DELETE, "
        "input_items and previous_response_id (proxray.serve.tenancy.responses)"))
    response_cache: ResponseCacheSpec | None = Field(None, description=(
        "serve repeated requests and paraphrases from a cache of answers, per key (or per keys-file cache group), "
        "billed nothing; off by default (proxray.serve.stages.cache)"))
    docs: bool = Field(False, description="serve /docs and /openapi.json")
    cors_origins: list[str] = Field([], max_length=64, description=(
        "origins whose web pages may call the endpoint from a browser (CORS), e.g. https://app.example.com, "
        "or ['*'] for any; empty = no CORS headers (browsers refuse cross-origin calls)"))
    monitor: str | None = Field(None, description="name of a detached proxray.monitor actor (namespace proxray) to report to")
    reload_every_s: float = Field(2.0, gt=0, description="how often to ask the monitor for a newer router artifact")
    router_num_cpus: float = Field(0.5, gt=0, description="CPUs each ingress replica reserves")
    router_resources: dict[str, float] = Field({}, description=(
        "custom Ray resources each ingress replica asks for, e.g. {proxray_ingress: 0.01} to keep the ingress on the "
        "CPU nodes that declare it (cluster.yaml's cpu_worker), so that losing a GPU node loses no ingress replica; "
        "the app's shared actors (keys ledgers, books, stores) ask a sliver of the same, so they live there too, off "
        "the head"))
    router_replicas: int = Field(1, ge=1, description="ingress replicas (each encodes and routes on its own)")
    router_max_replicas_per_node: int | None = Field(None, ge=1, description=(
        "at most this many ingress replicas on one node (1: spread them over nodes, so losing a node loses one)"))
    router_max_ongoing_requests: int = Field(64, ge=1, description="requests one ingress replica handles at once")
    router_max_queued_requests: int = Field(512, ge=1, description="past it the proxy answers 503 at once")

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, v):
        import re

        bad = [o for o in v if o != "*" and not re.fullmatch(r"https?://[^/\s?#]+", o)]
        if bad:
            raise ValueError(f"{bad}: an origin is scheme://host[:port] (no path, no trailing /) or '*'")
        return v

    @model_validator(mode="after")
    def _unique(self):
        if self.api_key_env and self.api_key_file:
            raise ValueError("api_key_env and api_key_file: give one of them, not both")
        ids = [m.id for m in self.models]
        if len(set(ids)) != len(ids) or ROUTER_MODEL in ids:
            raise ValueError(f"models: ids must be unique and not {ROUTER_MODEL!r} (got {ids})")
        for name, alias in self.model_aliases.items():
            unknown = [m for m in [alias.model, *(alias.allowed_models or [])] if m != ROUTER_MODEL and m not in ids]
            if unknown or name in ids or name == ROUTER_MODEL:
                raise ValueError(f"model_aliases.{name}: an alias names {ROUTER_MODEL!r} or served models (not "
                                 f"{unknown or name!r}) and is not itself a served model's id")
            if alias.model != ROUTER_MODEL and (alias.lam is not None or alias.allowed_models):
                raise ValueError(f"model_aliases.{name}: lam and allowed_models apply to routing (model: proxray)")
        unpriced = [m.id for m in self.models if m.price is None]
        if self.budget is not None and self.budget.basis == "realised" and unpriced:
            raise ValueError(f"budget.basis='realised' needs models[].price (input_per_mtok, output_per_mtok) for "
                             f"every model; missing for {', '.join(unpriced)}")
        return self


def load_api_key(args: AppArgs) -> bytes:
    """The bearer token the ingress requires (b"" = none), from ``api_key_file`` or ``api_key_env``;
    a configured source that is missing or empty is an error, never "no auth"."""
    from proxray.common.secrets import read_secret

    return read_secret(args.api_key_file, args.api_key_env).encode()
