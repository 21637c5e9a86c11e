"""What happens to each field of a Responses request (its fates: ``proxray.serve.protocols.fates``), at a model that
serves ``/v1/responses`` itself and at one that answers through chat completions (a chat-only endpoint, a co-hosted
vLLM model, a simulated one — each then honours or refuses the chat parameters it is sent, as its capabilities say).
The translator (``translate.to_chat``) decides by this table. No HTTP and no Ray."""
from __future__ import annotations

from proxray.serve.protocols import fates
from proxray.serve.protocols.fates import DROPPED, EMPTY, GATEWAY, PASSED, REFUSED, TRANSLATED, Fate

HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
                "computer_use_preview", "computer_use", "mcp", "local_shell", "shell", "apply_patch", "tool_search")
# include values that ask for output items or parts a model answering through chat never produces
EMPTY_INCLUDES = ("reasoning.encrypted_content", "web_search_call.action.sources", "web_search_call.results",
                  "file_search_call.results", "code_interpreter_call.outputs", "computer_call_output.output.image_url",
                  "message.input_image.image_url")


RESPONSES: tuple[Fate, ...] = (
    Fate("model", GATEWAY, GATEWAY, "names the model, an alias or `proxray` (routed); each candidate is sent its own "
         "name"),
    Fate("input", PASSED, TRANSLATED, "chat messages: message items (a `developer` message as `system`), "
         "`function_call` as the assistant's `tool_calls`, `function_call_output` as a `tool` message; text and "
         "image parts"),
    Fate("input[type=reasoning]", PASSED, DROPPED, "an earlier turn's reasoning: chat has no field for it (not stored "
         "with the answer either)"),
    Fate("input[other type]", PASSED, REFUSED, "item references, hosted tools' calls, files and audio have no chat "
         "form"),
    Fate("instructions", PASSED, TRANSLATED, "the first `system` message"),
    Fate("max_output_tokens", PASSED, TRANSLATED, "`max_completion_tokens` (the app's `default_max_tokens` where "
         "absent)"),
    Fate("stream", PASSED, TRANSLATED, "`stream`, with `stream_options.include_usage`"),
    Fate("stream_options", GATEWAY, GATEWAY, "read by the gateway for the stream it writes"),
    Fate("temperature", PASSED, PASSED, "`temperature`"),
    Fate("top_p", PASSED, PASSED, "`top_p`"),
    Fate("parallel_tool_calls", PASSED, PASSED, "`parallel_tool_calls`"),
    Fate("user", PASSED, PASSED, "`user`"),
    Fate("service_tier", PASSED, PASSED, "`service_tier`"),
    Fate("safety_identifier", PASSED, PASSED, "`safety_identifier`"),
    Fate("top_logprobs", PASSED, TRANSLATED, "`logprobs: true` and `top_logprobs`"),
    Fate("tools[type=function]", PASSED, TRANSLATED, "chat's `{type: function, function: {name, description, "
         "parameters, strict}}`"),
    Fate("tools[type=namespace]", PASSED, DROPPED, "a namespace's functions (Codex's sub-agents): a chat model is "
         "not offered them, since their calls have no chat form that names the namespace; the other tools stay"),
    Fate("tools[hosted]", PASSED, DROPPED, f"a hosted tool ({', '.join(HOSTED_TOOLS[:4])}, …) runs only at a model "
         "that serves the Responses API; `responses.hosted_tools: drop` (default: Codex offers `web_search` on "
         "every request) leaves it out and says so, `refuse` makes it a 400"),
    Fate("tools[other type]", PASSED, REFUSED, "a custom (grammar) tool has no chat form"),
    Fate("tool_choice", PASSED, TRANSLATED, "`auto`, `none`, `required` and a function as chat's; a hosted tool's "
         "choice is refused"),
    Fate("text.format", PASSED, TRANSLATED, "`response_format` (`json_object`, `json_schema`)"),
    Fate("text.verbosity", PASSED, REFUSED, "how long the answer is: chat has no field for it"),
    Fate("reasoning.effort", PASSED, TRANSLATED, "`reasoning_effort`"),
    Fate("reasoning.summary", PASSED, EMPTY, "a model answering through chat returns no reasoning items, so no "
         "summary"),
    Fate("include[reasoning.encrypted_content]", PASSED, EMPTY, "no reasoning items: nothing to include"),
    Fate("include[hosted tools' outputs]", PASSED, EMPTY, "no hosted tool runs: nothing to include"),
    Fate("include[other]", PASSED, REFUSED, "e.g. `message.output_text.logprobs`: ask with `top_logprobs`"),
    Fate("truncation", PASSED, REFUSED, "`auto` (the model drops what does not fit) has no chat form; `disabled` is "
         "what chat does"),
    Fate("prompt", PASSED, REFUSED, "a stored prompt template lives at the provider"),
    Fate("max_tool_calls", PASSED, REFUSED, "chat cannot bound a model's hosted tool calls"),
    Fate("metadata", PASSED, GATEWAY, "kept with the stored response and echoed in the answer"),
    Fate("store", GATEWAY, GATEWAY, "the gateway stores responses (`responses.store`); every model is sent "
         "`store: false`"),
    Fate("previous_response_id", GATEWAY, GATEWAY, "the gateway rebuilds the conversation from the responses it "
         "stored and sends it whole"),
    Fate("prompt_cache_key", PASSED, GATEWAY, "the conversation's identity where no `x-proxray-conversation` is "
         "sent: its turns keep their model by the cache-aware rule, a co-hosted model's replica by affinity"),
    Fate("client_metadata", PASSED, DROPPED, "a client's own telemetry (Codex's turn metadata)"),
    Fate("background", REFUSED, REFUSED, "not served: the endpoint answers while the client waits or streams"),
    Fate("conversation", REFUSED, REFUSED, "the Conversations API is not served: use `previous_response_id`"),
    Fate("proxray", GATEWAY, GATEWAY, "the routing options; never sent to a model"),
    Fate("any other field", PASSED, PASSED, "sent on under its own name: a chat model that does not know it refuses "
         "it by name"),
)
FIELDS = RESPONSES  # the table docs/generate.py and the tests read
CHAT_FATES = fates.chat_fates(RESPONSES)


def chat_fate(name: str) -> str:
    """A top-level field's fate at a chat model."""
    return fates.chat_fate(CHAT_FATES, name)
