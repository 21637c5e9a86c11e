"""Baselines the routers are measured against: random, largest model, oracle, and the paper's
two-head MLP (a parametric router: accuracy head + cost head over the same embeddings)."""
from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from proxray.routing.index import as_matrix
from proxray.routing.objective import choose
from proxray.routing.prox import RouterMixin


def oracle_choice(acc, cost, lam=0.0) -> np.ndarray:
    """Post-hoc best model per query (q,) by the *observed* acc - lam * cost (ties: cheaper)."""
    acc = np.asarray(acc, dtype=np.float64)
    return choose(acc, np.zeros_like(acc) if cost is None else cost, lam)


class _ConstantRouter(RouterMixin, BaseEstimator):
    def fit(self, X, acc, cost=None, models=None, encoder_id=None):
        _, acc, cost = self._fit_inputs(X, acc, cost, models, encoder_id)
        self.mean_acc_, self.mean_cost_ = acc.mean(0), cost.mean(0)
        return self

    def estimate(self, X):
        """The training means of every model for every query: (q, M) each."""
        self._check_fitted()
        q = len(as_matrix(X, dim=self.dim_))
        return np.tile(self.mean_acc_, (q, 1)), np.tile(self.mean_cost_, (q, 1))


class RandomRouter(_ConstantRouter):
    """Routes each query to a uniformly random model (seeded), whatever λ is."""

    def __init__(self, random_state=42):
        self.random_state = random_state

    def route(self, X, lam=0.0, allowed=None):
        self._check_fitted()
        q = len(as_matrix(X, dim=self.dim_))
        rng = np.random.default_rng(self.random_state)
        M = len(self.models_)
        if allowed is None:
            return rng.integers(0, M, size=q)
        allowed = np.broadcast_to(np.asarray(allowed, bool), (q, M))
        return np.array([rng.choice(np.flatnonzero(a)) for a in allowed], dtype=np.int64)


class LargestRouter(_ConstantRouter):
    """Always the largest model: the most expensive one on the training set (the most accurate
    one when the table has no cost), or the one named by ``model``."""

    def __init__(self, model=None):
        self.model = model

    def fit(self, X, acc, cost=None, models=None, encoder_id=None):
        super().fit(X, acc, cost, models, encoder_id)
        if self.model is not None:
            if self.model not in self.models_:
                raise ValueError(f"model={self.model!r} is not among the models {self.models_}")
            self.choice_ = self.models_.index(self.model)
        else:
            self.choice_ = int(np.argmax(self.mean_cost_ if self.has_cost_ else self.mean_acc_))
        return self

    def route(self, X, lam=0.0, allowed=None):
        self._check_fitted()
        return np.full(len(as_matrix(X, dim=self.dim_)), self.choice_, dtype=np.int64)


class MLPRouter(RouterMixin, BaseEstimator):
    """Two-head MLP router (torch, CPU): a shared hidden layer, an accuracy head (sigmoid, BCE) and a
    cost head (MSE on standardized cost). Parametric counterpart of the paper's appendix H.3.

    Learned: ``state_`` (torch weights as arrays), ``cost_mean_``, ``cost_scale_`` (M,), ``models_``.
    """

    def __init__(self, hidden=256, epochs=60, lr=1e-3, weight_decay=1e-4, batch_size=256, random_state=42):
        self.hidden = hidden
        self.epochs = epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.random_state = random_state

    def _net(self, d, M):
        import torch

        class TwoHead(torch.nn.Module):
            def __init__(s):
                super().__init__()
                s.body = torch.nn.Sequential(torch.nn.Linear(d, self.hidden), torch.nn.ReLU(), torch.nn.Dropout(0.1))
                s.acc = torch.nn.Linear(self.hidden, M)
                s.cost = torch.nn.Linear(self.hidden, M)

            def forward(s, x):
                h = s.body(x)
                return s.acc(h), s.cost(h)

        return TwoHead()

    def fit(self, X, acc, cost=None, models=None, encoder_id=None):
        import torch

        X, acc, cost = self._fit_inputs(X, acc, cost, models, encoder_id)
        self.cost_mean_ = cost.mean(0)
        self.cost_scale_ = np.where(cost.std(0) > 0, cost.std(0), 1.0)
        torch.manual_seed(self.random_state)
        net = self._net(self.dim_, acc.shape[1])
        opt = torch.optim.AdamW(net.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        tx = torch.from_numpy(X)
        ta = torch.from_numpy(acc.astype(np.float32))
        tc = torch.from_numpy(((cost - self.cost_mean_) / self.cost_scale_).astype(np.float32))
        gen = torch.Generator().manual_seed(self.random_state)
        bce, mse = torch.nn.BCEWithLogitsLoss(), torch.nn.MSELoss()
        net.train()
        for _ in range(int(self.epochs)):
            for b in torch.randperm(len(tx), generator=gen).split(int(self.batch_size)):
                la, lc = net(tx[b])
                loss = bce(la, ta[b]) + mse(lc, tc[b])
                opt.zero_grad()
                loss.backward()
                opt.step()
        self.state_ = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
        self._net_cache = None
        return self

    def _check_fitted(self):
        check_is_fitted(self, "state_", msg="This MLPRouter is not fitted: call fit(X, acc, cost) first")

    @property
    def n_train_(self):
        return 0  # a parametric router keeps no reference set

    def estimate(self, X):
        import torch

        self._check_fitted()
        X = as_matrix(X, dim=self.dim_)
        if getattr(self, "_net_cache", None) is None:
            net = self._net(self.dim_, len(self.models_))
            net.load_state_dict({k: torch.from_numpy(v) for k, v in self.state_.items()})
            self._net_cache = net.eval()
        with torch.no_grad():
            la, lc = self._net_cache(torch.from_numpy(X))
        acc_hat = torch.sigmoid(la).numpy().astype(np.float64)
        cost_hat = np.maximum(lc.numpy() * self.cost_scale_ + self.cost_mean_, 0.0)
        return acc_hat, cost_hat

    def _state(self):
        out = {f"w.{k}": v for k, v in self.state_.items()}
        out["cost_mean"], out["cost_scale"] = self.cost_mean_, self.cost_scale_
        return out

    def _set_state(self, arrays, meta):
        self.state_ = {k[2:]: v for k, v in arrays.items() if k.startswith("w.")}
        self.cost_mean_, self.cost_scale_ = arrays["cost_mean"], arrays["cost_scale"]
        self.dim_ = meta.dim
        self._net_cache = None
