"""ProxRouter's machinery, shared by its two families (paper §2.2, §3; ``knn``, ``kmeans``).

    U_hat_m(x) = Σ_i w_i(x) V_i,m        w_i(x) ∝ p_i · exp(−φ_i(x) / τ)      (``weights``, ``temperature``)

* ``KNNRouter``: the reference set is the k nearest training queries (r_i = x_i, V_i = their
  observed accuracy / cost, uniform prior).
* ``KMeansRouter``: the reference set is K clusters (r_i = centroid, V_i = cluster means,
  prior p_i ∝ n_i / s_i with s_i the mean member distance to the centroid).

``weighting="base"`` is the classic router (KMeans: nearest cluster only, kNN: uniform over the k);
``weighting="prox"`` tilts the prior by exp(-phi / tau) at the router's ``temperature`` (default ``"auto"``, the
temperature that ships for the router: the same router ``proxray fit`` builds; a number is a fixed 1/tau;
``proxray.routing.temperature``). The temperature is parsed once, when it is set, into a typed ``Temperature``. Accuracy and cost
are estimated separately, so λ is chosen per call (``route(X, lam)``) without refitting.

Both follow the scikit-learn contract: ``__init__`` stores hyperparameters, ``fit`` returns self, learned state
ends in ``_``, an unfitted router raises ``sklearn.exceptions.NotFittedError``. The two steps of an estimate are
public: ``neighbourhood(X)`` (distances, reference indices, prior) and ``estimate_at(w, nb)`` (Σ_i w_i V_i).
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from proxray.routing import artifact
from proxray.routing.index import as_matrix, prepare
from proxray.routing.objective import choose, lambda_for_target, objective
from proxray.routing.params import WEIGHTINGS, check_params
from proxray.routing.provenance import TrainingProvenance
from proxray.routing.temperature import Fixed, Temperature, legacy, parse_temperature


def check_targets(acc, cost, n: int | None = None):
    """Validate (acc, cost) training targets: (n, M) in [0, 1] and (n, M) >= 0 or None."""
    acc = np.asarray(acc, dtype=np.float64)
    if acc.ndim != 2:
        raise ValueError(f"acc must have shape (n, M), got shape {acc.shape}")
    if n is not None and acc.shape[0] != n:
        raise ValueError(f"acc has {acc.shape[0]} rows for {n} embeddings")
    if not (np.isfinite(acc).all() and (acc >= 0).all() and (acc <= 1).all()):
        raise ValueError("acc must be finite values in [0, 1]")
    if cost is None:
        return acc, None
    cost = np.asarray(cost, dtype=np.float64)
    if cost.shape != acc.shape:
        raise ValueError(f"cost shape {cost.shape} differs from acc shape {acc.shape}")
    if not (np.isfinite(cost).all() and (cost >= 0).all()):
        raise ValueError("cost must be finite values >= 0")
    return acc, cost


def cluster_sums(labels, values, K: int) -> np.ndarray:
    """Per-cluster sums (K, M) of ``values`` (n, M) for cluster ``labels`` (n,)."""
    return np.stack([np.bincount(labels, weights=values[:, m], minlength=K) for m in range(values.shape[1])], 1)


class RouterMixin(TrainingProvenance):
    """``route`` and ``utility`` for anything with ``estimate(X) -> (acc_hat, cost_hat)``."""

    def route(self, X, lam=0.0, allowed=None) -> np.ndarray:
        """Chosen model index per query (q,), maximizing acc_hat - lam * cost_hat."""
        acc_hat, cost_hat = self.estimate(X)
        return choose(acc_hat, cost_hat, lam, allowed)

    def calibrate(self, X_cal, target_cost: float | None = None, target_share: dict | None = None,
                  allowed=None) -> float:
        """The λ at which routing ``X_cal`` meets the budget (``lambda_for_target``): at most
        ``target_cost`` estimated USD per query, and/or at most ``target_share[m]`` of the queries to m."""
        acc_hat, cost_hat = self.estimate(X_cal)
        return lambda_for_target(acc_hat, cost_hat, self.models_, target_cost, target_share, allowed)

    def utility(self, X, lam=0.0) -> np.ndarray:
        """Estimated objective U_hat (q, M) = acc_hat - lam * cost_hat."""
        acc_hat, cost_hat = self.estimate(X)
        return objective(acc_hat, cost_hat, np.broadcast_to(np.asarray(lam, dtype=np.float64), len(acc_hat)))

    def _fit_inputs(self, X, acc, cost, models, encoder_id):
        """Validate fit inputs and record what every router learns about them (models_, has_cost_,
        encoder_id_, dim_). Returns (X (n, d) float32, acc (n, M), cost (n, M); zeros without cost)."""
        X = as_matrix(X)
        acc, cost = check_targets(acc, cost, n=len(X))
        if len(X) == 0:
            raise ValueError("cannot fit on an empty training set")
        models = [f"model_{j}" for j in range(acc.shape[1])] if models is None else [str(m) for m in models]
        if len(models) != acc.shape[1]:
            raise ValueError(f"models names {len(models)} entries for {acc.shape[1]} accuracy columns")
        if len(set(models)) != len(models):
            raise ValueError("models contains duplicate names")
        self.models_, self.has_cost_, self.encoder_id_, self.dim_ = models, cost is not None, encoder_id, X.shape[1]
        return X, acc, np.zeros_like(acc) if cost is None else cost

    def _check_fitted(self):
        check_is_fitted(self, "models_", msg=f"This {type(self).__name__} is not fitted: call fit(X, acc, cost) first")

    # Artifacts: arrays + a versioned, checksummed manifest (proxray.routing.artifact).
    def save(self, path):
        """A new version of the artifact at ``path`` (a folder or a URI); returns the version's location."""
        return artifact.save_router(self, path)

    @classmethod
    def load(cls, path, encoder_id: str | None = None):
        """An artifact of this class (``proxray.routing.registry.load_router`` loads any router class)."""
        return artifact.load_router(path, {cls.__name__: cls}, expected_class=cls, encoder_id=encoder_id)


class Neighbourhood(NamedTuple):
    """What the weights are computed over for a batch of queries: ``phi`` (q, n) distances to the reference
    elements (+inf: absent), ``ref`` (q, n) their indices into the training queries (kNN) or None (KMeans: all
    clusters, in order), and ``prior`` (n,) or None (uniform)."""
    phi: np.ndarray
    ref: np.ndarray | None
    prior: np.ndarray | None


class ProxRouter(RouterMixin, BaseEstimator):
    """Shared machinery: hyperparameters stored as passed (``get_params`` returns them) and validated once in
    ``fit`` against the family's spec (``proxray.routing.params``), targets, estimate = weights @ values."""

    # What a family says of itself (each family's class sets them; ``routing.registry.FAMILIES`` lists the classes):
    kind = ""  # its short name: the command line's --router, the registry's key, what "auto" resolves for
    name = ""  # as prose names it
    label = ""  # as the paper's tables and the reports' figures label it
    PARAMS: dict = {}  # its hyperparameters by name (``routing.params.Param``)
    temperatures: tuple = ("fixed",)  # the temperature kinds that apply to it (``routing.temperature.KINDS``)
    base_inv_tau = 0.0  # Base's 1/tau: the formula's limit for the family
    protocol = "leave-task-out"  # the evaluation protocol ``proxray eval`` runs it under by default
    default_outliers: tuple = ()  # the embedded table's tasks ``proxray eval`` holds out by default

    @classmethod
    def auto_temperature(cls) -> Temperature:
        """The temperature that ships for the family (``temperature="auto"``)."""
        raise NotImplementedError

    @classmethod
    def fit_bytes_per_query(cls, dim: int) -> int:
        """Memory a fit keeps per training query besides the embeddings and values (``params.check_fit``)."""
        return 0

    @classmethod
    def for_training(cls, params: dict, n_train: int) -> dict:
        """``params`` as they fit ``n_train`` training queries (``registry.make_router``)."""
        return params

    def _store(self, given: dict) -> None:
        """``__init__``'s parameters as passed (the scikit-learn contract), the deprecated ``inv_tau`` / ``tau``
        keywords turned into the temperature they meant."""
        deprecated = given.pop("deprecated", {})
        given.pop("self", None)
        if deprecated:
            unknown = set(deprecated) - {"inv_tau", "tau"}
            if unknown:
                raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments {sorted(unknown)}")
            temperature = given["temperature"]
            name = temperature if temperature in ("fixed", "spread", "bv", "plug-in", "ess") else "fixed"
            spec = legacy(deprecated.get("inv_tau"), deprecated.get("tau"), name)
            warnings.warn(f"{type(self).__name__}(inv_tau=..., tau=...) is deprecated: say temperature="
                          f"{spec if isinstance(spec, str) else spec.spec!r} instead", DeprecationWarning, stacklevel=3)
            given["temperature"] = spec
        for name, value in given.items():
            setattr(self, name, value)

    def parsed_temperature(self) -> Temperature:
        """``temperature`` as the typed ``Temperature`` it means for this family (``"auto"`` resolved); an error
        names the value and the allowed forms."""
        return parse_temperature(self.temperature, type(self))

    def _effective_temperature(self) -> Temperature:
        """The temperature the weights use: ``temperature`` for Prox; for Base the formula's limit (KMeans
        1/tau = inf, the nearest cluster; kNN 1/tau = 0, uniform over the k)."""
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting={self.weighting!r}: allowed values are {', '.join(WEIGHTINGS)}")
        temperature = self.parsed_temperature()  # checked for Base too: the spec holds for every setting
        if self.weighting == "base":
            return Fixed(self.base_inv_tau)
        return temperature

    def _init_common(self, X, acc, cost, models, encoder_id):
        """``fit``'s first step: every hyperparameter against the spec (at once, with the training queries'
        number), then the targets."""
        check_params(type(self), {name: getattr(self, name) for name in self.PARAMS}, n=len(X))
        temperature = self._effective_temperature()
        out = self._fit_inputs(X, acc, cost, models, encoder_id)
        self.temperature_ = temperature
        return out

    def neighbourhood(self, X) -> Neighbourhood:
        """Distances, reference indices and prior for raw query embeddings X (q, d): the first step of
        ``estimate``, which weighs them (``temperature_.weights``) and averages (``estimate_at``)."""
        self._check_fitted()
        return Neighbourhood(*self._phi(prepare(as_matrix(X, dim=self.dim_), self.metric)))

    def weights(self, X):
        """Weights over the reference set: (w (q, n_ref), ref_index (q, n_ref) or None)."""
        nb = self.neighbourhood(X)
        return self.temperature_.weights(nb.phi, nb.prior, self), nb.ref

    def estimate_at(self, w, nb):
        """Σ_i w_i V_i: (acc_hat (q, M), cost_hat (q, M)) for weights ``w`` (q, n) over the elements of ``nb`` (a
        ``Neighbourhood``, or its ``ref``)."""
        return self._values_at(w, nb.ref if isinstance(nb, Neighbourhood) else nb)

    def _values_at(self, w, ref):
        return w @ self.acc_values_, w @ self.cost_values_

    def estimate(self, X):
        """Estimated accuracy and cost of every model: (acc_hat (q, M), cost_hat (q, M))."""
        return self._values_at(*self.weights(X))

    def outlier_score(self, X) -> np.ndarray:
        """Distance (q,) from each query to its nearest reference element (0 = seen before)."""
        return self.neighbourhood(X).phi.min(axis=1)

    def training_outlier_scores(self, X, chunk: int = 4096) -> np.ndarray:
        """``outlier_score`` of training queries X (q,), as serving computes it but with each query left
        out of the reference set where it is an element of it (kNN: the distance to the nearest *other*
        training query; KMeans: to the nearest centroid). What an outlier threshold is calibrated on: the
        same distance the served router reports, in chunks (no q × n matrix)."""
        X = as_matrix(X, dim=self.dim_)
        return np.concatenate([self._loo_scores(prepare(X[i:i + chunk], self.metric))
                               for i in range(0, len(X), chunk)]) if len(X) else np.zeros(0)

    def _loo_scores(self, R) -> np.ndarray:
        return self._phi(R)[0].min(axis=1)

    def estimate_with_outlier_score(self, X):
        """``estimate`` and ``outlier_score`` from one search (the serving path needs both):
        (acc_hat (q, M), cost_hat (q, M), outlier (q,))."""
        nb = self.neighbourhood(X)
        acc_hat, cost_hat = self.estimate_at(self.temperature_.weights(nb.phi, nb.prior, self), nb)
        return acc_hat, cost_hat, nb.phi.min(axis=1)

    def _check_new_targets(self, acc, cost):
        if acc.shape[1] != len(self.models_):
            raise ValueError(f"acc has {acc.shape[1]} model columns, the router has {len(self.models_)}")
        if self.has_cost_ and cost is None:
            raise ValueError("this router was fitted with costs: new queries need costs too")

    def add_model(self, name: str, acc, cost=None):
        """Add a model column without refitting: acc/cost (n_train,) over the training queries in
        the order they were given to ``fit`` and ``add_queries``."""
        self._check_fitted()
        if str(name) in self.models_:
            raise ValueError(f"model {name!r} is already in the router")
        n = self.n_train_
        acc, cost = check_targets(np.asarray(acc, dtype=np.float64).reshape(-1, 1),
                                  None if cost is None else np.asarray(cost, dtype=np.float64).reshape(-1, 1), n=n)
        if self.has_cost_ and cost is None:
            raise ValueError("this router was fitted with costs: add_model needs the new model's cost too")
        self._append_model_column(acc, np.zeros_like(acc) if cost is None else cost)
        self.models_ = self.models_ + [str(name)]
        return self


