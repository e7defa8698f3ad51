"""A blend of several trained models' calibrated click probabilities, weighted on validation.

A tuning run leaves several good models behind (one per template: a linear model, two neural
ones, gradient-boosted trees). Their errors differ, so a weighted blend usually beats each on
both log loss and AUC; this module fits that blend from the members' *validation* probabilities
only (the test rows choose nothing), without Django or torch.

- **Where**: in logit space, ``sigmoid(sum_i w_i * logit(p_i))`` with the weights on the simplex
  (non-negative, summing to 1): a weighted geometric mean of the odds. Every member is already
  calibrated, so weights summing to one keep the blend's scale; a member with weight 0 drops out.
- **Fitting**: the weights minimising the validation log loss (L-BFGS on softmax logits).
- **Shrinkage**: on few validation rows the fitted weights follow noise, so the blend is
  ``lam * fitted + (1 - lam) * uniform`` with ``lam`` from ``SHRINK_GRID`` chosen by
  cross-fitting (``evaluation.crossfit_folds``): each fold scored by weights fitted on the other
  folds. Many rows pick ``lam`` = 1 (the fitted weights); fewer than ``EVENTS_PER_WEIGHT``
  rows of the rarer class per free weight take the plain average (``lam`` = 0) outright.
- **Honest score**: ``crossfit_logloss`` is that cross-fitted validation log loss at the chosen
  ``lam``: a validation score of the blend its weights were not fitted on, comparable with the
  members' ``evaluation.crossfit_logloss`` when choosing between the blend and one member.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

EPS = 1e-7
SHRINK_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
# The usual events-per-variable rule of logistic models: fitting a weight takes about ten rows
# of the rarer class; with fewer, the blend is the plain average (nothing fitted).
EVENTS_PER_WEIGHT = 10


def logit(prob: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(prob, dtype=np.float64), EPS, 1 - EPS)
    return np.log(p) - np.log1p(-p)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -500.0, 500.0)))


def _logloss(y: np.ndarray, z: np.ndarray) -> float:
    p = np.clip(_sigmoid(z), EPS, 1 - EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def fit_weights(label: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """Simplex weights (one per column of ``logits``, ``[rows, members]``) minimising the log
    loss of the blended logit."""
    from scipy.optimize import minimize

    y = np.asarray(label, dtype=np.float64)
    z = np.asarray(logits, dtype=np.float64)
    members = z.shape[1]
    if members == 1:
        return np.ones(1)

    def loss(a: np.ndarray) -> tuple[float, np.ndarray]:
        w = np.exp(a - a.max())
        w /= w.sum()
        blended = z @ w
        p = _sigmoid(blended)
        value = _logloss(y, blended)
        grad_w = z.T @ (p - y) / len(y)  # d loss / d w
        grad_a = w * (grad_w - w @ grad_w)  # through the softmax
        return value, grad_a

    result = minimize(loss, np.zeros(members), jac=True, method="L-BFGS-B")
    w = np.exp(result.x - result.x.max())
    return w / w.sum()


@dataclass
class Blend:
    """Fitted blend: ``weights`` per member name, the shrinkage ``lam`` it was fitted with and
    its cross-fitted validation log loss."""

    weights: dict[str, float]
    lam: float = 1.0
    crossfit_logloss: float | None = None
    fitted_weights: dict[str, float] = field(default_factory=dict)

    def predict(self, probs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The blend's click probabilities from every member's calibrated probabilities."""
        missing = sorted(set(self.weights) - set(probs))
        if missing:
            raise ValueError(f"no probabilities of the blend's members {missing}")
        z = sum(w * logit(probs[name]) for name, w in self.weights.items())
        return _sigmoid(np.asarray(z, dtype=np.float64))

    def to_json(self) -> dict:
        return {
            "weights": dict(self.weights),
            "lam": self.lam,
            "crossfit_logloss": self.crossfit_logloss,
            "fitted_weights": dict(self.fitted_weights),
        }


def _shrunk(w: np.ndarray, lam: float) -> np.ndarray:
    return lam * w + (1.0 - lam) * np.full(len(w), 1.0 / len(w))


def fit_blend(label: np.ndarray, probs: Mapping[str, np.ndarray], *, folds: int = 2) -> Blend:
    """The blend of ``probs`` (member name -> calibrated validation probabilities, the same rows
    in the same order as ``label``), its shrinkage chosen by cross-fitting."""
    from training.evaluation import crossfit_folds

    if not probs:
        raise ValueError("a blend needs at least one member")
    names = sorted(probs)
    y = np.asarray(label, dtype=np.float64)
    z = np.column_stack([logit(probs[n]) for n in names])
    if z.shape[0] != len(y):
        raise ValueError(f"{z.shape[0]} probabilities for {len(y)} rows")
    fitted = fit_weights(y, z)
    which = crossfit_folds(len(y), folds)
    losses: dict[float, float] = {}
    events = min(y.sum(), len(y) - y.sum())
    usable = events >= EVENTS_PER_WEIGHT * (len(names) - 1) and all(
        0 < y[which != k].sum() < (which != k).sum() for k in range(folds)
    )
    if usable:
        fold_weights = [fit_weights(y[which != k], z[which != k]) for k in range(folds)]
        for lam in SHRINK_GRID:
            blended = np.empty(len(y))
            for k in range(folds):
                rows = which == k
                blended[rows] = z[rows] @ _shrunk(fold_weights[k], lam)
            losses[lam] = _logloss(y, blended)
        # Ties go to the more shrunk blend (the simpler one).
        lam = min(SHRINK_GRID, key=lambda v: (round(losses[v], 12), v))
    else:
        lam = 0.0  # too few rows (or one class in a fold): the plain average
        losses[lam] = _logloss(y, z @ _shrunk(fitted, lam))  # fitted on nothing: honest
    weights = _shrunk(fitted, lam)
    return Blend(
        weights={n: float(w) for n, w in zip(names, weights, strict=True)},
        lam=float(lam),
        crossfit_logloss=losses.get(lam),
        fitted_weights={n: float(w) for n, w in zip(names, fitted, strict=True)},
    )
