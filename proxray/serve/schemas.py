"""Request and configuration models of the routed endpoint (validated at the HTTP/YAML boundary)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ROUTER_MODEL = "proxray"  # the model name that asks for routing


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class RoutingOptions(BaseModel):
    """Per-request routing options, sent in the body as ``"proxray": {...}`` (the openai client's
    ``extra_body``)."""

    model_config = ConfigDict(extra="forbid")
    lam: float | None = Field(None, ge=0, le=1e9, description="λ of acc − λ·cost; default: the app's")
    allowed_models: list[str] | None = Field(None, min_length=1, description="route only among these")
    max_cost: float | None = Field(None, ge=0, description="USD: skip models whose estimated cost is higher")


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=32768)
    temperature: float = Field(0.0, ge=0, le=2)
    seed: int | None = None
    stream: bool = False
    proxray: RoutingOptions = Field(default_factory=RoutingOptions)


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)

    @model_validator(mode="after")
    def _has_user_text(self):
        if not any(m.role == "user" and m.content.strip() for m in self.messages):
            raise ValueError("messages: at least one user message with non-empty content is required")
        return self

    def prompt(self) -> str:
        """The text the router embeds and the model answers: the last user message (with any system
        prompt before it, so the model sees it too)."""
        system = [m.content for m in self.messages if m.role in ("system", "developer")]
        user = [m.content for m in self.messages if m.role == "user"][-1]
        return "\n".join([*system, user]) if system else user


class CompletionRequest(_Common):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("prompt: exactly one prompt per request is supported")
            v = v[0]
        if not v.strip():
            raise ValueError("prompt: must not be empty")
        return v


class AutoscalingSpec(BaseModel):
    """Ray Serve ``autoscaling_config`` keys, checked (Serve itself lets a misspelt key pass)."""

    model_config = ConfigDict(extra="forbid")
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(2, ge=1)
    initial_replicas: int | None = Field(None, ge=0)
    target_ongoing_requests: float = Field(2.0, gt=0)
    upscale_delay_s: float = Field(2.0, ge=0)
    downscale_delay_s: float = Field(10.0, ge=0)
    metrics_interval_s: float | None = Field(None, gt=0)
    look_back_period_s: float | None = Field(None, gt=0)


class ServedModel(BaseModel):
    """One model deployment of the app."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, description="the name in the router artifact and in responses")
    engine: Literal["sim", "transformers", "vllm"]
    source: str | None = None
    engine_kwargs: dict = Field(default_factory=dict)
    num_cpus: float = Field(0.1, gt=0)
    num_gpus: float = Field(0, ge=0)
    accelerator_type: str | None = None
    placement_group_config: dict | None = Field(
        None, description="vllm: LLMConfig bundles, e.g. a half GPU, or {bundles: [{CPU: 0.1}]} on a CPU machine")
    runtime_env: dict | None = Field(None, description="vllm: runtime_env of the engine (env_vars, ...)")
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)


class AppArgs(BaseModel):
    """``args`` of the Serve application (``import_path: proxray.serve.app:build_app``)."""

    model_config = ConfigDict(extra="forbid")
    router: str = Field(description="router artifact folder (proxray fit / KNNRouter.save)")
    encoder: str | None = Field(None, description="sentence-transformers name or path; default: shipped MiniLM")
    models: list[ServedModel] = Field(min_length=1)
    lam: float = Field(0.0, ge=0, description="default λ when a request gives none")
    api_key_env: str | None = Field(None, description="env var holding the bearer token; unset = no auth")
    timeout_s: float = Field(30.0, gt=0, description="per model call; then the next-best model answers")
    max_prompt_chars: int = Field(32000, ge=1)
    default_max_tokens: int = Field(256, ge=1)
    monitor: str | None = Field(None, description="name of a detached proxray.monitor actor (namespace proxray) to report to")
    reload_every_s: float = Field(2.0, gt=0, description="how often to ask the monitor for a newer router artifact")
    router_num_cpus: float = Field(0.5, gt=0)
    router_replicas: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _unique(self):
        ids = [m.id for m in self.models]
        if len(set(ids)) != len(ids) or ROUTER_MODEL in ids:
            raise ValueError(f"models: ids must be unique and not {ROUTER_MODEL!r} (got {ids})")
        return self
