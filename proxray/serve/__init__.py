"""Serving: the routed OpenAI-compatible endpoint on Ray Serve (``proxray.serve.app:build_app``).
Importing this package imports nothing heavy; ``proxray.serve.app`` imports Ray Serve."""
