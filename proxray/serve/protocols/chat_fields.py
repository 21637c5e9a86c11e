"""What each kind of pool model does with each field of a chat completions or completions request. These two protocols
are relayed: the request reaches the chosen model as it was sent (``model`` rewritten, ``proxray`` removed), and the
model honours a field or refuses it by name (a 400 naming it; routing passes such a model over for that request). A
hosted endpoint (``engine: openai``) takes what its server takes; a co-hosted vLLM model what vLLM's request models
have (``VLLMModelServer``: a field vLLM would ignore with a log line is refused instead); the CPU engines what
``deployments.models.CPU_HONOURED`` says, the simulated one also tools (``deployments.sim_tools``). A field set to its
"not asked" value (``deployments.models.NOT_ASKED``: ``logprobs: false``, ``store: false``, ...) is taken by every
model. A hint (``hint``: a provider's prompt cache, metadata, storage or tier, no effect on the answer's meaning) is
not sent to a model that does not take it and is named in the answer instead (``chat.HintsDropped``). The HTTP reference's support matrices are written from this table (``docs/generate.py``), and
``tests/test_fields.py`` checks each row against the engines. No HTTP and no Ray."""
from __future__ import annotations

from dataclasses import dataclass

from proxray.serve.protocols.fates import DROPPED, GATEWAY, PASSED, REFUSED

ENGINES = ("openai", "vllm", "sim", "transformers")
ALL, VLLM, SIM = frozenset(ENGINES), frozenset({"openai", "vllm"}), frozenset({"openai", "vllm", "sim"})
HOSTED = frozenset({"openai"})
LEGEND = {GATEWAY: "honoured by the gateway itself, not sent on",
          PASSED: "taken by the model",
          DROPPED: "a hint with no effect on the answer's meaning: not sent to that model, named in the answer's "
                   "`dropped` and the header `x-proxray-dropped`",
          REFUSED: "the model refuses it by name: a 400 naming it (a routed request passes that model over)"}


@dataclass(frozen=True)
class ChatField:
    field: str
    honoured_by: frozenset  # the engines whose models take it; the others refuse it by name
    how: str
    completions: bool = True  # a completions request's field too (``messages`` and tools are chat's only)
    chat: bool = True
    hint: bool = False  # no effect on the answer's meaning: dropped and named where the model does not take it

    def fate(self, engine: str) -> str:
        if self.field in ("model", "proxray"):
            return GATEWAY
        if engine in self.honoured_by:
            return PASSED
        return DROPPED if self.hint else REFUSED


CHAT_FIELDS: tuple[ChatField, ...] = (
    ChatField("model", ALL, "names the model, an alias or `proxray` (routed); each candidate is sent its own name"),
    ChatField("proxray", ALL, "the routing options ([`RoutingOptions`](config.md#routingoptions)); never sent to a "
              "model"),
    ChatField("messages", ALL, "the CPU engines read text parts (an image part is refused by name) and the whole "
              "conversation through the model's chat template", completions=False),
    ChatField("prompt", ALL, "one prompt (a list of one)", chat=False),
    ChatField("max_tokens", ALL, "one of `max_tokens` and `max_completion_tokens`; a request with neither gets the "
              "app's `default_max_tokens`"),
    ChatField("max_completion_tokens", ALL, "as `max_tokens`", completions=False),
    ChatField("max_completion_tokens", frozenset({"openai", "sim", "transformers"}), "chat's name for `max_tokens`; "
              "vLLM's completions refuse it", chat=False),
    ChatField("stream", ALL, "server-sent events, as the API writes them"),
    ChatField("stream_options", ALL, "`include_usage`: the usage chunk last"),
    ChatField("n", ALL, "at most 16"),
    ChatField("temperature", ALL, "0 to 2"),
    ChatField("top_p", ALL, "0 to 1"),
    ChatField("seed", ALL, "the CPU engines are deterministic in it"),
    ChatField("stop", ALL, "a string or a list"),
    ChatField("user", ALL, "taken; the CPU engines do nothing with it"),
    ChatField("tools", SIM, "the simulated engine calls a tool `tool_choice` forces (an example of its schema)",
              completions=False),
    ChatField("tool_choice", SIM, "`none` is taken by every model", completions=False),
    ChatField("parallel_tool_calls", ALL, "taken by every model; only the ones that call tools act on it",
              completions=False),
    ChatField("response_format", VLLM, "`{type: text}` is taken by every model; vLLM's structured outputs for the "
              "rest"),
    ChatField("logprobs", VLLM, "`false` is taken by every model"),
    ChatField("top_logprobs", VLLM, "with `logprobs`", completions=False),
    ChatField("logit_bias", VLLM, ""),
    ChatField("presence_penalty", VLLM, "`0` is taken by every model"),
    ChatField("frequency_penalty", VLLM, "`0` is taken by every model"),
    ChatField("reasoning_effort", VLLM, "", completions=False),
    ChatField("echo", VLLM, "`false` is taken by every model", chat=False),
    ChatField("suffix", VLLM, "", chat=False),
    ChatField("best_of", HOSTED, "at most 16; vLLM 0.29 no longer takes it", chat=False),
    ChatField("store", HOSTED, "the provider keeps the completion for its dashboards and evals", completions=False,
              hint=True),
    ChatField("metadata", HOSTED, "tags for the provider's dashboards", completions=False, hint=True),
    ChatField("prompt_cache_key", HOSTED, "the provider's prompt cache; also the conversation's id where the request "
              "names none (`proxray.conversation`, `x-proxray-conversation`)", completions=False, hint=True),
    ChatField("prompt_cache_retention", HOSTED, "the provider's prompt cache", completions=False, hint=True),
    ChatField("prompt_cache_options", HOSTED, "the provider's prompt cache", completions=False, hint=True),
    ChatField("moderation", HOSTED, "the provider's moderation", completions=False),
    ChatField("safety_identifier", HOSTED, "the provider's abuse detection", completions=False, hint=True),
    ChatField("service_tier", HOSTED, "the provider's capacity tier", completions=False, hint=True),
    ChatField("modalities", HOSTED, "audio output", completions=False),
    ChatField("audio", HOSTED, "audio output", completions=False),
    ChatField("prediction", HOSTED, "predicted outputs", completions=False),
    ChatField("verbosity", HOSTED, "", completions=False),
    ChatField("web_search_options", HOSTED, "the provider's web search", completions=False),
    ChatField("functions", HOSTED, "the deprecated form of `tools`", completions=False),
    ChatField("function_call", HOSTED, "the deprecated form of `tool_choice`", completions=False),
    ChatField("any other field", VLLM, "a co-hosted vLLM model takes vLLM's own (`top_k`, `min_p`, "
              "`repetition_penalty`, ...) and refuses the rest by name; a hosted endpoint gets it as sent"),
)


def fields_of(chat: bool) -> tuple[ChatField, ...]:
    """The rows of chat completions' table (``chat``) or completions'."""
    return tuple(f for f in CHAT_FIELDS if (f.chat if chat else f.completions))


HINTS = {chat: frozenset(f.field for f in fields_of(chat) if f.hint) for chat in (True, False)}  # per protocol
