"""The routed, OpenAI-compatible endpoint as one Ray Serve application: ``proxray.serve.app:build_app`` is the
``import_path`` a Serve config names (``args`` follow ``proxray.serve.config.AppArgs``). The builder
(``proxray.serve.builder``) checks the args — the same checks ``proxray check`` runs — and binds one deployment per
model around the ingress (``proxray.serve.ingress.RouterIngress``); ``build(args, protocols)`` serves another protocol
table (``proxray.serve.protocols``) from Python."""
from proxray.serve.builder import app_problems, build, build_app
from proxray.serve.ingress import RouterIngress, deployment_name

__all__ = ["RouterIngress", "app_problems", "build", "build_app", "deployment_name"]
