"""What a fitted router remembers of its training queries beyond their state: their ids and tasks (what the evidence
of a decision names, ``proxray.routing.explain``) and the outlier threshold, saved in the artifact beside the state
(``_provenance`` / ``_set_provenance``) and grown by ``add_queries``."""
from __future__ import annotations

import numpy as np

OUTLIER_QUANTILE = 0.99  # a query scoring above this quantile of the training queries' own scores is an outlier
OUTLIER_SAMPLE = 2000  # training queries the threshold is computed on


def outlier_threshold(router, X) -> float | None:
    """The one outlier threshold of a router fitted on X: the ``OUTLIER_QUANTILE`` of its training queries' own
    outlier scores (each left out of the reference), on a seeded sample of ``OUTLIER_SAMPLE``. Saved in the artifact
    (``outlier_threshold_``): ``explain`` and the drift monitor read it there."""
    n = len(X)
    pick = np.random.default_rng(0).choice(n, min(n, OUTLIER_SAMPLE), replace=False)
    scores = router.training_outlier_scores(np.asarray(X)[np.sort(pick)])
    return float(np.quantile(scores, OUTLIER_QUANTILE)) if len(scores) else None


class TrainingProvenance:
    """Mixed into every ProxRouter (``prox.RouterMixin``); needs ``training_outlier_scores``."""

    def _note_training(self, X, query_ids, tasks) -> None:
        """The training queries' ids and tasks (optional, one each per row), and the outlier threshold: the
        ``OUTLIER_QUANTILE`` of the training queries' own outlier scores (each left out), on a seeded sample."""
        n = len(X)
        for name, v in (("query_ids", query_ids), ("tasks", tasks)):
            if v is not None and len(v) != n:
                raise ValueError(f"{name} has {len(v)} entries for {n} training queries")
            setattr(self, name + "_", None if v is None else np.asarray([str(x) for x in v]))
        self.outlier_threshold_ = outlier_threshold(self, X)

    @staticmethod
    def _check_growth(n: int, query_ids, tasks) -> None:
        for name, v in (("query_ids", query_ids), ("tasks", tasks)):
            if v is not None and len(v) != n:
                raise ValueError(f"{name} has {len(v)} entries for {n} new queries")

    def _grow_training(self, n: int, query_ids, tasks) -> None:
        """``add_queries``, once the rows are in: the new rows' ids and tasks (empty where not given)."""
        for name, v in (("query_ids", query_ids), ("tasks", tasks)):
            have = getattr(self, name + "_", None)
            if have is not None:
                setattr(self, name + "_", np.concatenate([have, np.asarray([""] * n if v is None else
                                                                           [str(x) for x in v])]))

    def _provenance(self) -> dict:
        out = {name: getattr(self, name + "_") for name in ("query_ids", "tasks")
               if getattr(self, name + "_", None) is not None}
        if getattr(self, "outlier_threshold_", None) is not None:
            out["outlier_threshold"] = np.asarray(self.outlier_threshold_, dtype=np.float64)
        return out

    def _set_provenance(self, arrays: dict) -> None:
        self.query_ids_, self.tasks_ = arrays.get("query_ids"), arrays.get("tasks")
        t = arrays.get("outlier_threshold")
        # a scalar, saved 0-d; earlier artifacts hold it as shape (1,) (float() of that fails on NumPy 2.4)
        self.outlier_threshold_ = None if t is None else float(np.asarray(t).reshape(()))
