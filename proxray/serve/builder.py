"""The app's argument checks and its deployment graph, in one place: ``app_problems`` names everything that would
fail inside a replica — the router (reachable, versioned, fitted with the app's encoder, knowing every served model),
the models (sources, engine arguments, vLLM), the relayed models' fields, secrets, the keys file and the key file —
and is what both ``build_app`` (which builds nothing while any remains, so a bad deploy fails in ``serve status``
before any replica starts) and ``proxray check`` run. ``build_app`` binds one deployment per model and the ingress."""
from __future__ import annotations

import os

from proxray.serve.config import AppArgs, ServedModel
from proxray.serve.deployments.models import ModelServer
from proxray.serve.ingress import RouterIngress, deployment_name
from proxray.serve.preflight import relay_problems, router_problems
from proxray.serve.tenancy.keys import read_keys


# how often Serve's controller asks each model replica whether it lives (its default, 10 s, leaves a dead replica
# unreplaced, and requests waiting for it, for up to 10 s; the check is a cheap call on its own thread)
HEALTH_CHECK_PERIOD_S = 2.0

# how a vLLM deployment picks the replica of a request: a conversation's turns on one replica (its prefix cached there)
SESSION_ROUTER = "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter"
SESSION_FALLBACK_REPLICAS = 2  # replicas tried after a conversation's own when it is full


def app_args(args: dict) -> AppArgs:
    """The app's ``args`` validated (every field problem at once), as its rehearsal when ``simulate``."""
    return rehearsed(AppArgs.model_validate(args))


def rehearsed(a: AppArgs) -> AppArgs:
    """``a`` as its rehearsal when ``simulate`` (every model the simulated engine, ``proxray.pool.simulated.rehearsal``:
    resources, prices and routing kept), else as it is."""
    if not a.simulate:
        return a
    from proxray.pool.simulated import rehearsal

    return a.model_copy(update={"models": [rehearsal(m) for m in a.models]})


def app_problems(a: AppArgs, where: str = "") -> tuple[dict, list]:
    """``({model id: source, local folders made absolute}, [every problem])`` of validated args ``a``; ``where``
    prefixes the fields problems name (``applications.0.args.`` in a Serve config)."""
    from proxray.common.secrets import key_file_problems, secret_problems
    from proxray.pool.preflight import check_models

    problems = router_problems(a.router, a.encoder, [m.id for m in a.models], a.new_models, f"{where}router")
    sources, found = check_models(a.models, a.default_max_tokens, serving=True)
    problems += found + relay_problems(a.models, f"{where}models") + secret_problems(a.models, f"{where}models")
    if a.keys_file:

        try:
            unknown = sorted({m for k in read_keys(os.path.expanduser(a.keys_file)).keys
                              for m in k.allowed_models or () if m not in {x.id for x in a.models}})
            if unknown:
                problems.append(f"{where}keys_file: allowed_models name models the app does not serve: "
                                f"{', '.join(unknown)}")
        except (OSError, ValueError) as e:
            problems.append(f"{where}keys_file: {str(e).splitlines()[0]}")
    if a.api_key_file:
        problems += key_file_problems(a.api_key_file, f"{where}api_key_file")
    return sources, problems


def _vllm_deployment(m: ServedModel, source: str):
    """A ray.serve.llm deployment for a vLLM model (``VLLMModelServer``: ``LLMServer`` with the gateway's
    ``respond``), named like every other model deployment and bound with its autoscaling and queue limits.
    GPU or CPU is the config's business (``placement_group_config`` bundles, ``accelerator_type``,
    ``engine_kwargs``, ``runtime_env``)."""
    from ray.serve.llm import LLMConfig, build_llm_deployment

    from proxray.pool.vllm_adapter import vllm_engine_kwargs, vllm_placement
    from proxray.serve.deployments.vllm_server import VLLMModelServer  # defers ray.serve.llm (it needs vLLM)

    from ray.serve.config import RequestRouterConfig

    # a conversation's turns on the replica whose prefix cache holds it: Serve's consistent-hash router over the
    # session id the ingress sends (ModelClient.session), the next replicas on the ring where that one is full
    # (max_ongoing_requests); a request without a conversation is spread evenly
    affinity = RequestRouterConfig(request_router_class=SESSION_ROUTER,
                                   request_router_kwargs={"num_fallback_replicas": SESSION_FALLBACK_REPLICAS})
    cfg = LLMConfig(model_loading_config={"model_id": m.id, "model_source": source},
                    engine_kwargs=vllm_engine_kwargs(m), accelerator_type=m.accelerator_type,
                    deployment_config={"autoscaling_config": m.autoscaling.model_dump(exclude_none=True),
                                       "request_router_config": affinity},
                    **vllm_placement(m))
    # name_prefix="" falls back to "LLMServer:"; override_serve_options gives the plain name
    serve_options = {"name": deployment_name(m.id), "max_queued_requests": m.max_queued_requests,
                     "health_check_period_s": HEALTH_CHECK_PERIOD_S}
    if m.max_replicas_per_node:
        serve_options["max_replicas_per_node"] = m.max_replicas_per_node
    if m.max_ongoing_requests:
        serve_options["max_ongoing_requests"] = m.max_ongoing_requests
    return build_llm_deployment(cfg, override_serve_options=serve_options, deployment_cls=VLLMModelServer)


def build_app(args: dict):
    """The Serve application of a Serve config's ``args`` (Serve calls an application builder with that one
    dictionary): ``build`` with the shipped protocols."""
    return build(args)


def build(args: dict, protocols: dict | None = None, families: tuple = ()):
    """The Serve application: one deployment per model plus the router ingress (``simulate``: every model the
    simulated engine, ``proxray.pool.simulated.rehearsal``); ``protocols``: the client protocols it serves,
    ``{route: Protocol}`` (default: ``proxray.serve.protocols.PROTOCOLS``; a protocol added here is served on its
    route with nothing else to change); ``families``: router families its replicas register
    (``proxray.routing.registry.register``) before they load the router, beside the shipped ones."""
    a = app_args(args)
    sources, problems = app_problems(a)
    if len(problems) == 1:
        raise ValueError(f"invalid app args: {problems[0]}")
    if problems:
        raise ValueError("invalid app args:\n" + "\n".join(f"  {p}" for p in problems))
    handles = {}
    for m in a.models:
        if m.engine == "vllm":
            handles[m.id] = _vllm_deployment(m, sources[m.id])
        elif m.engine == "openai":  # relayed by the router's replicas (proxray.serve.deployments.endpoint_server)
            handles[m.id] = {"relay": m.model_dump()}
        else:  # a CPU engine in the replica
            handles[m.id] = ModelServer.options(
                name=deployment_name(m.id), autoscaling_config=m.autoscaling.model_dump(exclude_none=True),
                ray_actor_options={"num_cpus": m.cpus(0.1), "num_gpus": m.gpus,
                                   **({"accelerator_type": m.accelerator_type} if m.accelerator_type else {})},
                max_ongoing_requests=m.max_ongoing_requests or 8,
                max_queued_requests=m.max_queued_requests, health_check_period_s=HEALTH_CHECK_PERIOD_S,
                **({"max_replicas_per_node": m.max_replicas_per_node} if m.max_replicas_per_node else {}),
            ).bind({**m.model_dump(), "source": sources[m.id] if m.engine == "transformers" else m.source})
    spread = {"max_replicas_per_node": a.router_max_replicas_per_node} if a.router_max_replicas_per_node else {}
    placed = {"num_cpus": a.router_num_cpus, **({"resources": a.router_resources} if a.router_resources else {})}
    return RouterIngress.options(num_replicas=a.router_replicas, ray_actor_options=placed, **spread,
                                 max_ongoing_requests=a.router_max_ongoing_requests,
                                 max_queued_requests=a.router_max_queued_requests).bind(a.model_dump(), handles,
                                                                                        protocols, tuple(families))
