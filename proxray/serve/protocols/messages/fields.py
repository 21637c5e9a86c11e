"""What happens to each field of a Messages request (its fates: ``proxray.serve.protocols.fates``), at a model that
serves ``/v1/messages`` itself and at one that answers through chat completions. The translator
(``translate.to_chat``) decides by this table. No HTTP and no Ray."""
from __future__ import annotations

from proxray.serve.protocols import fates
from proxray.serve.protocols.fates import DROPPED, GATEWAY, PASSED, REFUSED, TRANSLATED, Fate

MESSAGES: tuple[Fate, ...] = (
    Fate("model", GATEWAY, GATEWAY, "names the model, an alias or `proxray` (routed); each candidate is sent its own "
         "name"),
    Fate("max_tokens", PASSED, PASSED, "`max_tokens`"),
    Fate("messages", PASSED, TRANSLATED, "chat messages: text and image blocks as parts, `tool_use` as the assistant's "
         "`tool_calls`, `tool_result` as `tool` messages (a result's images follow as a user message)"),
    Fate("messages[thinking]", PASSED, DROPPED, "earlier turns' `thinking` and `redacted_thinking` blocks: chat has no "
         "field for them"),
    Fate("messages[other block]", PASSED, REFUSED, "documents, search results and server tools' results have no chat "
         "form"),
    Fate("system", PASSED, TRANSLATED, "the first `system` message (with any `system` turns)"),
    Fate("stream", PASSED, TRANSLATED, "`stream`, with `stream_options.include_usage`"),
    Fate("stop_sequences", PASSED, TRANSLATED, "`stop`"),
    Fate("temperature", PASSED, PASSED, "`temperature`"),
    Fate("top_p", PASSED, PASSED, "`top_p`"),
    Fate("tools[with input_schema]", PASSED, TRANSLATED, "chat functions"),
    Fate("tools[server tool]", PASSED, REFUSED, "a tool without `input_schema` runs at Anthropic only"),
    Fate("tool_choice", PASSED, TRANSLATED, "`auto`, `any` → `required`, `tool` → that function, `none`; "
         "`disable_parallel_tool_use` → `parallel_tool_calls: false`"),
    Fate("metadata", PASSED, DROPPED, "read by the gateway (its `user_id` names the session), not sent to a chat model"),
    Fate("thinking", PASSED, DROPPED, "a model that reasons returns its reasoning all the same, as `thinking` blocks"),
    Fate("top_k", PASSED, DROPPED, "a sampling hint chat has no field for"),
    Fate("service_tier", PASSED, DROPPED, "Anthropic's capacity tier"),
    Fate("context_management", PASSED, DROPPED, "Anthropic's context editing"),
    Fate("output_config", PASSED, DROPPED, "Anthropic's output settings"),
    Fate("container", PASSED, DROPPED, "Anthropic's code execution container"),
    Fate("mcp_servers", PASSED, DROPPED, "Anthropic's MCP connector"),
    Fate("proxray", GATEWAY, GATEWAY, "the routing options; never sent to a model"),
    Fate("any other field", PASSED, DROPPED, "a field the Messages API does not have: dropped and named"),
)
FIELDS = MESSAGES  # the table docs/generate.py and the tests read
CHAT_FATES = fates.chat_fates(MESSAGES)


def chat_fate(name: str) -> str:
    """A top-level field's fate at a chat model."""
    return fates.chat_fate(CHAT_FATES, name)
