"""A third router family in one file: the k nearest training queries at a small k, weighted at a fixed temperature
only. What a family is: a ProxRouter class that describes itself (its short name, labels, hyperparameters, the
temperatures it takes and its shipped one, its evaluation protocol and default outliers); one registry line
(``proxray.routing.registry.register``) makes the command line, fitting, evaluation and artifacts take it."""
from proxray.routing.knn import KNNRouter
from proxray.routing.params import METRIC, TEMPERATURE, WEIGHTING, Param
from proxray.routing.temperature import Fixed, Temperature

PARAMS = {p.name: p for p in (Param("k", int, 5, "neighbours per query", low=1, high="n", cli="--k"),
                              WEIGHTING, TEMPERATURE, METRIC)}


class FewNeighboursRouter(KNNRouter):
    """The k (default 5) nearest training queries, tilted at 1/tau = 5 unless told otherwise."""

    kind, name, label = "few", "few neighbours", "Few"
    PARAMS = PARAMS
    temperatures = ("fixed",)
    protocol = "leave-task-out"
    default_outliers = ("gsm8k", "svamp")

    def __init__(self, k=5, weighting="prox", temperature="auto", metric="cosine"):
        super().__init__(k=k, weighting=weighting, temperature=temperature, metric=metric)

    @classmethod
    def auto_temperature(cls) -> Temperature:
        return Fixed(5.0)
