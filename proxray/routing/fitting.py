"""The fit recipe, one library function that ``proxray fit``, the evaluation-and-fit job and anyone's script call with
typed settings: a routing table's matrices checked against the hyperparameters, its prompts encoded, the router made
from the registry and fitted (``fit_table``), and saved where asked (``fit_and_save``)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from proxray.routing.params import check_fit
from proxray.routing.registry import DEFAULT_ROUTER, ROUTERS, family, make_router


class FitSettings(BaseModel):
    """What a fit is asked for: the router family (``routing.registry.ROUTERS``), the table's models it routes among
    (default: all), hyperparameters by name (``routing.params``; default: the family's), the weighting and the
    temperature (a ``routing.temperature.Temperature`` or its spelling), the encoder (a name, a path or ``static``;
    default: the shipped MiniLM)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    router: str = DEFAULT_ROUTER
    models: list[str] | None = None
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    weighting: str | None = None
    temperature: Any = None
    encoder: str | None = None

    @field_validator("router")
    @classmethod
    def _a_family(cls, v: str) -> str:
        if v not in ROUTERS:
            raise ValueError(f"router={v!r}: allowed values are {', '.join(ROUTERS)}")
        return v


def fit_table(table, settings: FitSettings, spelled: dict | None = None, encoder_choice: dict | None = None):
    """The router ``settings`` ask for, fitted on ``table`` (a ``proxray.data.table.RoutingTable``). The
    hyperparameters are checked against the table before its prompts are encoded (``spelled``: how the caller names
    them in errors, e.g. the command line's options); ``encoder_choice``: the record of an automatic encoder choice,
    kept in the artifact."""
    from proxray.embeddings.encoder import SentenceEncoder

    models = settings.models or table.models
    acc, cost = table.matrices(models=models)
    check_fit(family(settings.router), settings.hyperparameters, len(acc), len(models), spelled=spelled)
    enc = SentenceEncoder(settings.encoder)
    X = enc.encode(table.prompts)
    router = make_router(settings.router, settings.weighting, settings.hyperparameters, settings.temperature)
    router.fit(X, acc, cost, models=models, encoder_id=enc.id, query_ids=table.query_ids, tasks=table.tasks)
    if encoder_choice is not None:
        router.encoder_choice_ = encoder_choice
    return router


def fit_and_save(table_uri: str, out: str, settings: FitSettings | None = None):
    """The routing table at ``table_uri`` read, a router fitted on it (``fit_table``) and saved to ``out`` (a folder
    or a URI, checked writable before the table is read); returns the router."""
    from proxray.common.storage import check_location
    from proxray.data.table import RoutingTable

    check_location(out, "out", write=True)
    router = fit_table(RoutingTable.read(table_uri), settings or FitSettings())
    router.save(out)
    return router
