"""What the app checks where it is built, before any replica starts (``build_app``; ``proxray check`` and
``proxray serve`` run the same): the router artifact is readable and versioned, fitted with the encoder the app will
use, and knows every served model (or the model is declared new); every model's source and engine arguments."""
from __future__ import annotations


def router_problems(router: str, encoder: str | None, served: list, new_models: list = (),
                    where: str = "router") -> list:
    """Every problem of the router ``router`` for an app that encodes with ``encoder`` and serves ``served``."""
    from proxray.embeddings.encoder import encoder_id
    from proxray.routing.artifact import ArtifactError, read_manifest

    try:
        manifest = read_manifest(router)
    except (ArtifactError, OSError, ValueError) as e:
        return [f"{where}: {e}"]
    problems = []
    try:
        want = encoder_id(encoder)
    except (ValueError, ImportError) as e:
        return [f"encoder: {e}"]
    if manifest.encoder_id != want:
        fix = encoder_setting(manifest.encoder_id)
        problems.append(f"{where}: the router was fitted on embeddings of {manifest.encoder_id!r}, the app encodes with "
                        f"{want!r}: set encoder: {fix} in the app's args, or fit the router with the app's encoder "
                        f"(proxray fit --encoder {encoder_setting(want)})")
    unknown = [m for m in served if m not in manifest.models and m not in new_models]
    if unknown:
        problems.append(f"models {unknown}: the router does not know them (it knows {', '.join(manifest.models)}); fit "
                        "it on a table that has them, or list them in new_models to serve them by name until the "
                        "monitor adds them to the router")
    stale = [m for m in new_models if m in manifest.models]
    if stale:
        problems.append(f"new_models {stale}: the router knows them already; leave them out of new_models")
    undeclared = [m for m in new_models if m not in served]
    if undeclared:
        problems.append(f"new_models {undeclared}: not models of this app")
    if not set(manifest.models) & set(served):
        problems.append(f"{where}: the app serves none of the router's models ({', '.join(manifest.models)}): "
                        "nothing could be routed")
    return problems


def encoder_setting(encoder_id: str) -> str:
    """How an app's ``encoder:`` (and ``proxray fit --encoder``) names the encoder of this id."""
    return {"sentence-transformers/all-MiniLM-L6-v2": "(leave it out: the shipped MiniLM, the default)",
            "static:sentence-transformers/all-MiniLM-L6-v2": "static"}.get(encoder_id, encoder_id)


RELAYED = ("autoscaling", "max_replicas_per_node", "max_queued_requests", "num_cpus", "num_gpus", "accelerator_type")


def relay_problems(models, where: str = "models") -> list:
    """Serving fields set on an ``engine: openai`` model, which the router's replicas relay in their own process
    (``proxray.serve.deployments.endpoint_server``): it has no replicas to scale, place or queue for."""
    return [f"{where}: model {m.id!r}: {f}: an openai model is relayed by the router's replicas and has no replicas of "
            "its own (router_replicas scales it; max_ongoing_requests caps it per router replica)"
            for m in models if m.engine == "openai" for f in RELAYED if f in m.model_fields_set]
