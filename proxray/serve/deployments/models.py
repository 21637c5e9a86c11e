"""The model deployments, all behind one interface (what the ingress calls, whatever the engine):
    respond(endpoint, body)  ->  async stream of OpenAI JSON objects

``endpoint`` is the request's path at the model (``proxray.serve.wire``: the internal request's chat completions or
completions, the only forms a co-hosted engine takes; a relayed endpoint takes any protocol's path it serves),
``body`` the request as sent (only ``model`` rewritten). Without ``stream`` it yields one response object; with it, the chunks as they are generated.
A request the model refuses yields one ``{"error": {...}}`` object with the HTTP status as ``code``.
``OpenAIModel.respond`` is that method for every engine: it runs the engine's ``_respond``, records what came in
and how the call ended, and closes the engine's stream as soon as the caller goes away.

* ``ModelServer`` (here): the CPU engines (sim, transformers), which implement the OpenAI semantics
  themselves: chat template over the whole conversation, ``n``, ``stop``, ``max_tokens`` /
  ``max_completion_tokens``, ``finish_reason``, usage, ``stream_options.include_usage``; the simulated engine also
  tools (``sim_tools``). What they cannot honour (``response_format``, ``logprobs``, the transformers engine's
  ``tools``, ...) is refused by name.
* ``proxray.serve.deployments.vllm_server.VLLMModelServer``: ray.serve.llm's ``LLMServer`` (vLLM's own OpenAI
  serving), the same interface on top.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque

from ray import serve

from proxray.pool.engine import Finish
from proxray.pool.engines import make_engine
from proxray.pool.spec import Sampling
from proxray.serve.config import ServedModel
from proxray.serve.deployments import sim_tools
from proxray.serve.deployments.liveness import BEAT, heartbeats
from proxray.serve.errors import error
from proxray.serve.wire import CHAT_PATH, COMPLETIONS_PATH


def _replica() -> str | None:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - not in a replica (a unit test's model)
        return None


class OpenAIModel:
    """What every model deployment shares: ``respond`` over the engine's ``_respond``, remembering the last
    requests received (what the gateway passed through) and how each ended (a caller that went away stops the
    generation), so a test or an operator can see both."""

    async def respond(self, endpoint: str, body: dict, heartbeat_s: float | None = None):
        """``heartbeat_s`` (a call through a deployment handle): ``liveness.BEAT`` whenever the engine has been quiet
        that long, so the caller tells a lost replica from a slow one."""
        if heartbeat_s:
            yield {**BEAT, "replica": _replica()}  # taken: which replica has the request (the report's model_replica)
            async for obj in heartbeats(self.respond(endpoint, body), heartbeat_s):
                yield obj
            return
        if not hasattr(self, "_seen"):
            self._seen, self._ends = deque(maxlen=32), deque(maxlen=32)
        at = time.time()
        self._seen.append({"endpoint": endpoint, "body": body, "at": at})
        end = {"endpoint": endpoint, "objects": 0, "ended": "running", "at": at}
        self._ends.append(end)
        gen = self._respond(endpoint, body)
        try:
            async for obj in gen:
                end["objects"] += 1
                yield obj
            end["ended"] = "complete"
        except (GeneratorExit, asyncio.CancelledError):
            end["ended"] = "cancelled"  # the caller went away: the engine's generation stops here
            raise
        except BaseException:
            end["ended"] = "failed"
            raise
        finally:
            await gen.aclose()  # now, not when the collector finds it (vLLM aborts the request on close)

    async def _respond(self, endpoint: str, body: dict):
        raise NotImplementedError
        yield  # an async generator

    async def seen(self) -> list:
        """The last (up to 32) requests this replica received (``endpoint``, ``body``, ``at``: when), oldest
        first."""
        return list(getattr(self, "_seen", ()))

    async def ends(self) -> list:
        """How the last (up to 32) calls ended, oldest first: dicts of ``endpoint``, ``objects`` (how many it
        yielded), ``ended`` (running, complete, cancelled — the caller went away — or failed) and ``at`` (when it
        began)."""
        return list(getattr(self, "_ends", ()))

    async def capabilities(self) -> dict:
        """The request parameters this model honours, per endpoint: the routing plan leaves a model out
        of a request that sets anything else (``refused_parameters``)."""
        raise NotImplementedError


# Parameters the CPU engines honour; anything else with a value other than "not asked" is refused by name.
CPU_HONOURED = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
                "stop", "n", "stream", "stream_options", "user"}
NOT_ASKED = {"logprobs": (False,), "echo": (False,), "presence_penalty": (0,), "frequency_penalty": (0,),
             "response_format": ({"type": "text"},), "tool_choice": ("none",), "parallel_tool_calls": (True, False),
             "store": (False,), "metadata": ({},)}


def cpu_honoured(engine: str, endpoint: str) -> set:
    """The parameters a CPU engine's model takes at ``endpoint``: the simulated engine's chat also takes tools."""
    return CPU_HONOURED | sim_tools.HONOURED if engine == "sim" and endpoint == CHAT_PATH else CPU_HONOURED


def refused_parameters(body: dict, honoured=CPU_HONOURED) -> list:
    """The parameters of ``body`` set to something other than "not asked" that a model honouring only
    ``honoured`` would have to drop: it refuses them by name instead."""
    return sorted(k for k, v in body.items()
                  if k not in honoured and v is not None and v not in NOT_ASKED.get(k, ()))


def _sampling(body: dict) -> tuple[Sampling, list]:
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else list(stop)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    seed = body.get("seed")
    t, p = body.get("temperature"), body.get("top_p")
    return Sampling(temperature=0.0 if t is None else float(t), max_tokens=int(max_tokens or 256),
                    seed=42 if seed is None else int(seed) % 2**32, top_p=1.0 if p is None else float(p)), stop


def _messages(body: dict):
    """The conversation as role / text pairs (text parts joined), or an error naming a part it cannot read."""
    out = []
    for i, m in enumerate(body["messages"]):
        content = m.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if part.get("type") != "text":
                    return None, error(400, f"messages.{i}.content.{j}: this model reads text parts only, "
                                            f"not {part.get('type')!r}", f"messages.{i}.content.{j}.type")
            content = "\n".join(p["text"] for p in content)
        if m.get("tool_calls"):
            return None, error(400, f"messages.{i}.tool_calls: this model cannot read tool calls",
                               f"messages.{i}.tool_calls")
        out.append({"role": m["role"], "content": content or ""})
    return out, None


@serve.deployment
class ModelServer(OpenAIModel):
    """One pool model on a CPU engine (sim, transformers). Generation runs in worker threads, so a replica
    keeps accepting requests (what the autoscaler counts) while it streams."""

    def __init__(self, spec: dict):
        self.spec = ServedModel(**spec)
        self.engine = make_engine(self.spec)

    def _honoured(self, endpoint: str) -> set:
        return cpu_honoured(self.spec.engine, endpoint)

    async def capabilities(self) -> dict:
        return {CHAT_PATH: sorted(self._honoured(CHAT_PATH)), COMPLETIONS_PATH: sorted(CPU_HONOURED)}

    async def _respond(self, endpoint: str, body: dict):
        refused = refused_parameters(body, self._honoured(endpoint))
        if refused:
            yield error(400, f"model {self.spec.id!r} ({self.spec.engine} engine) cannot honour: "
                             f"{', '.join(refused)}", refused[0], unsupported=True)
            return
        tools = endpoint == CHAT_PATH and self.spec.engine == "sim"  # earlier tool calls and results read as text
        messages, problem = None, None
        if endpoint == CHAT_PATH:
            messages, problem = _messages({**body, "messages": sim_tools.readable(body["messages"])} if tools else body)
        if problem:
            yield problem
            return
        prompt = None
        if endpoint == COMPLETIONS_PATH:
            prompt = body["prompt"][0] if isinstance(body["prompt"], list) else body["prompt"]
        sampling, stop = _sampling(body)
        n = int(body.get("n") or 1)
        chat = endpoint == CHAT_PATH
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.spec.id}
        if tools and (fn := sim_tools.forced(body)):  # a call of the tool the request forces
            for obj in sim_tools.answer(head, fn, body):
                yield obj
            return
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        texts, reasons = [""] * n, ["stop"] * n
        for i in range(n):
            s = sampling.model_copy(update={"seed": sampling.seed + i})
            it = iter(self.engine.stream(messages, prompt, s, stop))
            first = True
            while True:
                item = await asyncio.to_thread(next, it, None)
                if item is None:
                    break
                if isinstance(item, Finish):
                    usage["prompt_tokens"] = item.input_tokens
                    usage["completion_tokens"] += item.output_tokens
                    reasons[i] = item.reason
                    break
                texts[i] += item
                if body.get("stream"):
                    yield {**head, "choices": [self._delta(chat, i, item, first)]}
                    first = False
            if body.get("stream"):
                if first and chat:  # nothing was generated: the role still opens the choice
                    yield {**head, "choices": [self._delta(chat, i, "", True)]}
                end = {"index": i, "delta": {}, "finish_reason": reasons[i]} if chat else \
                    {"index": i, "text": "", "finish_reason": reasons[i], "logprobs": None}
                yield {**head, "choices": [end]}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if body.get("stream"):
            if (body.get("stream_options") or {}).get("include_usage"):
                yield {**head, "choices": [], "usage": usage}
            return
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": r, "logprobs": None}
                       for i, (t, r) in enumerate(zip(texts, reasons))]
        else:
            choices = [{"index": i, "text": t, "finish_reason": r, "logprobs": None}
                       for i, (t, r) in enumerate(zip(texts, reasons))]
        yield {**head, "object": "chat.completion" if chat else "text_completion", "choices": choices, "usage": usage}

    @staticmethod
    def _delta(chat: bool, i: int, text: str, first: bool) -> dict:
        if not chat:
            return {"index": i, "text": text, "finish_reason": None, "logprobs": None}
        return {"index": i, "delta": {"role": "assistant", "content": text} if first else {"content": text},
                "finish_reason": None}
