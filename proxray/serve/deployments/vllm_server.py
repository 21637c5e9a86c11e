"""vLLM models: ray.serve.llm's ``LLMServer`` (vLLM's own OpenAI serving) behind the gateway's one model
interface, ``respond(endpoint, body)`` (see ``proxray.serve.deployments.models``). Imported only when an app has a
vLLM model (it imports ray.serve.llm)."""
from __future__ import annotations

import json

from pydantic import ValidationError
from ray.serve.llm import LLMServer

from proxray.pool.upstream import error_object, error_status
from proxray.serve.deployments.models import OpenAIModel, refused_parameters
from proxray.serve.errors import error, validation_message
from proxray.serve.wire import CHAT_PATH, COMPLETIONS_PATH


def _objects(item):
    """What LLMServer yields, as OpenAI JSON objects: a response or error object, or (streaming) a batch of
    ``data: {...}`` server-sent-event strings."""
    for x in item if isinstance(item, list) else [item]:
        if isinstance(x, str):
            for line in x.splitlines():
                if line.startswith("data: ") and line[6:].strip() != "[DONE]":
                    yield json.loads(line[6:])
        elif hasattr(x, "model_dump"):
            yield x.model_dump(mode="json", exclude_none=False)
        else:
            yield x


class VLLMModelServer(OpenAIModel, LLMServer):
    """``LLMServer`` plus ``respond``: the body is validated against vLLM's own request model (a parameter
    vLLM does not know is refused by name instead of being dropped with a log line), then served by
    vLLM's OpenAI layer, whose responses, chunks, usage and finish reasons come back unchanged."""

    async def capabilities(self) -> dict:
        from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

        return {CHAT_PATH: sorted(ChatCompletionRequest.model_fields),
                COMPLETIONS_PATH: sorted(CompletionRequest.model_fields)}

    async def _respond(self, endpoint: str, body: dict):
        from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

        cls = ChatCompletionRequest if endpoint == CHAT_PATH else CompletionRequest
        unknown = refused_parameters(body, cls.model_fields)
        if unknown:
            yield error(400, f"model {body.get('model')!r} (vllm) does not know the parameter(s): {', '.join(unknown)}",
                        unknown[0], unsupported=True)
            return
        try:
            request = cls.model_validate(body)
        except ValidationError as e:
            yield error(400, *validation_message(e))
            return
        stream = await (self.chat(request) if endpoint == CHAT_PATH else self.completions(request))
        try:
            async for item in stream:
                for obj in _objects(item):
                    if isinstance(obj, dict) and (err := error_object(obj)):
                        obj = error(error_status(err), err.get("message", ""), err.get("param"),
                                    err.get("type") or "server_error")
                    yield obj
        finally:  # a caller that went away closes this generator: close vLLM's now, which aborts the request
            if hasattr(stream, "aclose"):
                await stream.aclose()
