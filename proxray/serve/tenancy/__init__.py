"""Tenancy: API keys with their policy, rate and budget (``keys``), conversations (``conversations``), answers kept
for feedback (``feedback``), and the shared actors they live in, restarted or created anew (``shared_actor``)."""
