"""The ``proxray`` report every answer carries (a whole answer's ``proxray`` object, a stream's first chunk's), field by
field: what each means and when it is there. The HTTP reference (``docs/reference/http.md``) is written from this
table, and the tests check every report they see against it (``undocumented``)."""
from __future__ import annotations

# field -> (when it is present, what it means)
REPORT_FIELDS: dict[str, tuple[str, str]] = {
    "model": ("always", "the model that answered"),
    "routed": ("always", "true where the router chose the model (`model: \"proxray\"` or an alias that routes); "
               "false for a model named in the request"),
    "lam": ("routed", "λ of the decision acc − λ·cost (null to a key of the keys file where the served budget's "
                      "controller set it: every key's traffic moves it)"),
    "lam_from": ("routed", "where λ came from: `request` (`proxray.lam`), `alias` (the model alias's), `key` (the "
                 "API key's), `budget` (the served budget's controller), `over_budget` (the key past a `cheapest` "
                 "budget: cost decides), `app` (the app's `lam`)"),
    "outlier_score": ("routed", "how far the query lies from what the router was fitted on (the nearest "
                      "neighbours' or clusters' distance; to 2 decimals for a key of the keys file); also the header "
                      "`x-proxray-outlier-score`"),
    "router_path": ("routed, the app's single key", "the router artifact that decided"),
    "estimates": ("routed", "`{model: {accuracy, cost}}`: the router's estimates of each candidate, in the order "
                  "they were (or would have been) tried"),
    "runner_up": ("routed", "the second candidate, or null"),
    "excluded": ("routed, where a model refuses a parameter", "`{model: [parameters]}`: models left out because "
                 "their endpoint cannot honour those parameters of the request"),
    "estimated_accuracy": ("routed", "the answering model's estimated accuracy"),
    "estimated_cost": ("routed", "its estimated cost in USD; also the header `x-proxray-estimated-cost`"),
    "fallback_from": ("always", "the models that failed before the one that answered (empty when none); also the "
                      "header `x-proxray-fallback-from`"),
    "failures": ("always", "`[{model, error}]`: each failed try and why"),
    "conversation": ("a conversation id (`proxray.conversation`, `x-proxray-conversation`, a Messages session, a "
                     "Responses `previous_response_id`, a `prompt_cache_key`)", "`{id, rule, action, previous, gain, …}`: `action` is `new`, "
                     "`kept` or `switched`; `rule` `cache_aware` (each model's cost this turn's expected bill there), "
                     "`margin`, `first_turn` or `table` (the router's table estimates: the conversation's first turn, "
                     "or a candidate without a price). Under `cache_aware`: `gain` (the best other model's objective "
                     "over the conversation's model's as if its cache held nothing), `cache_value` (λ × what its cache "
                     "saves this turn; it switched where the gain was larger), `why`, `runner_up`, and `cache: "
                     "{prompt_tokens, output_tokens, expected_cached_tokens: {model: tokens}, billed_cached_tokens}` "
                     "(billed: a whole answer's, where its asker may see cache reads). Under `margin`: `gain`, "
                     "`margin`, `direction`; `tool_loop: true` where a turn returning tool results stayed"),
    "evidence": ("`proxray.explain` or `x-proxray-explain: 1`", "the neighbours or clusters with the most weight, "
                 "every model's estimate and objective, the winner's margin, the outlier score against the router's "
                 "threshold, `explain_ms`; for a key of the keys file, distances to 2 decimals and no reference's "
                 "`query_id` or `row`"),
    "budget": ("a served budget (`budget:`), the app's single key", "the budget's state: `cost_per_query` (its target), `basis`, "
               "`recent_mean_cost`, `requests` (and `unmetered` on a realised basis); λ is `lam`, beside it"),
    "route_ms": ("routed", "ms to route: encode, estimate, plan"),
    "latency_s": ("always", "seconds from the request's arrival to its answer (a stream's first content)"),
    "timings": ("always", "`{read_ms, parse_ms, embed_ms, embedding_cache, encode_ms, encoder_batch, "
                "conversation_ms, estimate_ms, model_ms}`: where the gateway's time went; a key of the keys file sees "
                "`embed_ms` as the encoder pass alone and no cache or batch fields"),
    "replica": ("always", "the ingress replica that answered"),
    "model_replica": ("a co-hosted model", "the replica of the model's deployment that took the request (a "
                      "conversation's turns on a vLLM model stay on one: its prefix cache)"),
    "key": ("a key of the keys file", "`{name, spent_usd, over_budget}`: the key's name (never its secret), its spend "
            "in its window when admitted, whether it was past its budget"),
    "not_stored": ("Responses, `store` asked for but not done", "why the response was not stored"),
    "dropped": ("Messages or Responses at a model that answers through chat completions, where the translation left "
                "something out; chat completions with a hint the model does not take", "the request's fields (or "
                "tools, items) that do not change the answer's meaning and that the model was not sent: those chat "
                "has no form for (`thinking`, `client_metadata`, a hosted tool, …) and a provider's hints "
                "(`prompt_cache_key`, `metadata`, `store`, …) at a model that takes none (the support matrices in the "
                "HTTP reference); also the header `x-proxray-dropped`"),
}


def undocumented(report: dict) -> list[str]:
    """The fields of ``report`` the table does not list."""
    return sorted(k for k in report if k not in REPORT_FIELDS)


def completed(report: dict, latency_s: float, timings: dict, replica: str, stream, key_report: dict | None,
              keyed: bool) -> None:
    """``report`` in place, once its answer has begun: the latency, where the gateway's time went, the ingress
    replica that answered and the model replica that took it (where it said), the key's own report; and, for a key
    of the keys file (``keyed``), only what it may see of its own request — nothing of the app's or other keys'
    traffic."""
    report["latency_s"] = latency_s
    report["timings"] = timings
    report["replica"] = replica
    if (served_by := model_replica(stream)) is not None:
        report["model_replica"] = served_by
    if key_report:
        report["key"] = key_report
    if keyed:
        private(report)


COARSE = 2  # decimals of a distance a key is shown: the router's references may hold other keys' absorbed prompts


def private(report: dict) -> None:
    """What a key of the keys file is not shown of its own report: the app's router path, the encoder's batch, how long
    its text waited for the encoder (other keys' load) and whether the cache held it (another key may have sent it) —
    ``report`` in place; its ``embed_ms`` is the encoder pass alone. Distances to the router's references (the outlier
    score, the evidence's) are coarsened and the evidence names no reference query: those the drift monitor absorbed
    are other keys' prompts, and an exact distance, or a query's id (a hash of its text), would tell a key whether
    another sent a prompt it guesses."""
    report.pop("router_path", None)  # the served budget's state and λ stay: the key's own controller's
    if isinstance(report.get("outlier_score"), float):
        report["outlier_score"] = round(report["outlier_score"], COARSE)
    evidence = report.get("evidence")
    if evidence:
        evidence["outlier_score"] = round(evidence["outlier_score"], COARSE)
        for element in evidence.get("elements", []):
            element.pop("query_id", None)
            element.pop("row", None)
            element["distance"] = round(element["distance"], COARSE)
    timings = report.get("timings", {})
    if "encode_ms" in timings:
        timings["embed_ms"] = timings["encode_ms"]
    for name in ("embedding_cache", "encoder_batch", "encode_ms"):
        timings.pop(name, None)


def model_replica(stream) -> str | None:
    """The replica of a co-hosted model's deployment that took the request (its stream, or the stream a protocol's
    translation reads), where it said."""
    while stream is not None:
        if getattr(stream, "replica", None) is not None:
            return stream.replica
        stream = getattr(stream, "inner", None)
    return None
