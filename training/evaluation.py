"""Evaluation (T10) and feature importance (F10) on the held-out split.

numpy, scikit-learn's metrics (AUC, log loss, ROC) and torch for scoring, no Django at import:
the training child evaluates its model right after training. What scikit-learn does not have is
written here: the quantile calibration table with its row counts (``calibration_curve`` gives no
counts), the expected calibration error and the temperature fit.

``production_bundle_path`` asks the resolvers that right-hand apps register (serving registers the
workspace's current production model) so the agent can score that model on the same held-out rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

EPS = 1e-7
CALIBRATION_BINS = 10
ROC_POINTS = 101
MIN_SLICE_ROWS = 20

_PRODUCTION_RESOLVERS: list[Callable[[Any], str | None]] = []


def register_production_model_resolver(fn: Callable[..., str | None]) -> None:
    """``fn(workspace, deployment="") -> bundle directory or None``; serving registers its
    production model (of the named deployment; blank: the workspace's only one)."""
    if fn not in _PRODUCTION_RESOLVERS:
        _PRODUCTION_RESOLVERS.append(fn)


def production_bundle_path(workspace, deployment: str = "") -> str | None:
    for resolver in _PRODUCTION_RESOLVERS:
        path = resolver(workspace, deployment)
        if path:
            return str(path)
    return None


def auc(label: np.ndarray, score: np.ndarray) -> float | None:
    """Area under the ROC curve (scikit-learn's; ties count half); None when one class is
    missing."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(label, dtype=np.float64) > 0.5
    if y.all() or not y.any():
        return None
    return float(roc_auc_score(y, np.asarray(score, dtype=np.float64)))


def logloss(label: np.ndarray, prob: np.ndarray) -> float:
    """Mean log loss (scikit-learn's) of probabilities clipped to [EPS, 1 - EPS]; NaN without
    rows."""
    from sklearn.metrics import log_loss

    y = np.asarray(label, dtype=np.float64)
    if not len(y):
        return float("nan")
    p = np.clip(np.asarray(prob, dtype=np.float64), EPS, 1 - EPS)
    return float(log_loss(y > 0.5, p, labels=[False, True]))


def roc_curve(label: np.ndarray, score: np.ndarray, points: int = ROC_POINTS) -> list[list[float]]:
    """[[fpr, tpr], ...]: scikit-learn's ROC curve, thinned to at most ``points`` + 1 points
    (enough for a plot); empty when one class is missing."""
    from sklearn.metrics import roc_curve as sk_roc_curve

    y = np.asarray(label) > 0.5
    if y.all() or not y.any():
        return []
    fpr, tpr, _ = sk_roc_curve(y, np.asarray(score, dtype=np.float64), drop_intermediate=True)
    picks = np.unique(np.linspace(0, len(fpr) - 1, points).astype(int))
    curve = [[round(float(fpr[i]), 4), round(float(tpr[i]), 4)] for i in picks]
    if curve[0] != [0.0, 0.0]:
        curve.insert(0, [0.0, 0.0])
    return curve


def calibration(label: np.ndarray, prob: np.ndarray, bins: int = CALIBRATION_BINS) -> list[dict]:
    """Quantile bins of predicted CTR: mean predicted, observed rate and count in each."""
    y = np.asarray(label, dtype=np.float64)
    p = np.asarray(prob, dtype=np.float64)
    if not len(y):
        return []
    order = np.argsort(p, kind="mergesort")
    out = []
    for chunk in np.array_split(order, min(bins, len(order))):
        if len(chunk):
            out.append(
                {
                    "predicted": round(float(p[chunk].mean()), 6),
                    "observed": round(float(y[chunk].mean()), 6),
                    "count": len(chunk),
                }
            )
    return out


def ece(label: np.ndarray, prob: np.ndarray, bins: int = CALIBRATION_BINS) -> float | None:
    """Expected calibration error: |observed - mean predicted| over ``bins`` equal-width
    probability bins, weighted by each bin's share of rows; None without rows."""
    y = np.asarray(label, dtype=np.float64)
    p = np.clip(np.asarray(prob, dtype=np.float64), 0.0, 1.0)
    if not len(y):
        return None
    which = np.minimum((p * bins).astype(np.int64), bins - 1)
    counts = np.bincount(which, minlength=bins)
    gap = np.abs(
        np.bincount(which, weights=y, minlength=bins)
        - np.bincount(which, weights=p, minlength=bins)
    )
    return float(gap.sum() / counts.sum())


def summary(label: np.ndarray, prob: np.ndarray) -> dict[str, Any]:
    y = np.asarray(label, dtype=np.float64)
    p = np.asarray(prob, dtype=np.float64)
    observed = float(y.mean()) if len(y) else 0.0
    predicted = float(p.mean()) if len(p) else 0.0
    return {
        "auc": auc(y, p),
        "logloss": logloss(y, p),
        "ece": ece(y, p),
        "observed_ctr": observed,
        "predicted_ctr": predicted,
        "calibration_ratio": predicted / observed if observed else None,
        "rows": len(y),
    }


def predict_logits(model, dense, cat, batch_size: int = 65536) -> np.ndarray:
    """The model's raw logits (float64), in eval mode, batch by batch."""
    import torch

    was_training = model.training
    model.eval()
    out = []
    with torch.inference_mode():
        for start in range(0, int(dense.shape[0]), batch_size):
            logits = model(dense[start : start + batch_size], cat[start : start + batch_size])
            out.append(logits.float().cpu().numpy())
    if was_training:
        model.train()
    return np.concatenate(out).astype(np.float64) if out else np.zeros(0)


def predict(
    model, dense, cat, batch_size: int = 65536, *, calibration: dict | None = None
) -> np.ndarray:
    """Click probabilities, through ``calibration`` (a bundle's ``extra["calibration"]``)."""
    from training.bundle import apply_calibration

    return apply_calibration(predict_logits(model, dense, cat, batch_size), calibration)


def predict_bundle(bundle, split) -> np.ndarray:
    """A stored bundle's probabilities on an encoded split, calibrated like serving's."""
    return predict(
        bundle.model, split.dense, split.cat, calibration=bundle.spec.extra.get("calibration")
    )


def fit_temperature(label: np.ndarray, logits: np.ndarray) -> float:
    """The temperature T minimising the log loss of ``sigmoid(logits / T)`` (LBFGS on log T)."""
    import torch
    from torch.nn import functional as F

    z = torch.as_tensor(np.asarray(logits, dtype=np.float64))
    y = torch.as_tensor(np.asarray(label, dtype=np.float64))
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.LBFGS([log_t], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        optimiser.zero_grad()
        loss = F.binary_cross_entropy_with_logits(z / log_t.exp(), y)
        loss.backward()
        return loss

    optimiser.step(closure)
    temperature = float(log_t.detach().exp())
    return temperature if np.isfinite(temperature) and temperature > 0 else 1.0


def fit_isotonic(label: np.ndarray, prob: np.ndarray) -> dict[str, list[float]]:
    """An isotonic map from raw to calibrated probability, as its thresholds (``x``, ``y``)."""
    from sklearn.isotonic import IsotonicRegression

    fit = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip", increasing=True)
    fit.fit(np.asarray(prob, dtype=np.float64), np.asarray(label, dtype=np.float64))
    # A bin without a click would map to probability 0 (an infinite log loss on the next click
    # there): the floor is half a click over the fitted rows, and the ceiling likewise.
    floor = 0.5 / len(label)
    return {
        "x": [float(v) for v in fit.X_thresholds_],
        "y": [float(v) for v in np.clip(fit.y_thresholds_, floor, 1.0 - floor)],
    }


def fit_calibration(method: str, label: np.ndarray, logits: np.ndarray) -> dict[str, Any] | None:
    """The bundle's ``extra["calibration"]`` fitted on (validation) ``label``/``logits``;
    None for ``"none"`` or without both classes."""
    y = np.asarray(label, dtype=np.float64)
    if method == "none" or not len(y) or y.min() == y.max():
        return None
    if method == "temperature":
        return {"method": "temperature", "temperature": fit_temperature(y, logits)}
    if method == "isotonic":
        from training.bundle import apply_calibration

        return {"method": "isotonic", **fit_isotonic(y, apply_calibration(logits, None))}
    raise ValueError(f"unknown calibration {method!r}; use none, temperature or isotonic")


CROSSFIT_FOLDS = 2


def crossfit_folds(n: int, folds: int = CROSSFIT_FOLDS) -> np.ndarray:
    """Fold of each of ``n`` rows: interleaved (row i in fold i mod ``folds``), so with
    time-ordered validation rows every fold spans the whole period."""
    return np.arange(n) % max(1, folds)


def crossfit_logloss(
    method: str, label: np.ndarray, logits: np.ndarray, folds: int = CROSSFIT_FOLDS
) -> float | None:
    """The validation log loss of a calibrated model that calibration did not see: each fold's
    rows scored through the calibration fitted on the other folds' rows (cross-fitting).

    The calibrated validation log loss (``metrics["validation"]["logloss"]``) scores the rows
    the calibration was fitted on, which flatters it by roughly (calibration params) / (2 *
    rows): nothing on 10,000 rows, a lot on 20 (the smaller a validation split, the more
    optimistic, and the more a choice among trials or templates follows that noise). None when
    a fold has no rows or the fitting rows lack a class (then only the in-sample value exists).
    """
    prob = crossfit_probabilities(method, label, logits, folds)
    return None if prob is None else logloss(np.asarray(label, dtype=np.float64), prob)


def crossfit_probabilities(
    method: str, label: np.ndarray, logits: np.ndarray, folds: int = CROSSFIT_FOLDS
) -> np.ndarray | None:
    """Each validation row's calibrated probability from the calibration fitted on the other
    folds (``crossfit_logloss`` scores them); None when that cannot be fitted."""
    from training.bundle import apply_calibration

    y = np.asarray(label, dtype=np.float64)
    z = np.asarray(logits, dtype=np.float64)
    if len(y) < 2 * folds:
        return None
    which = crossfit_folds(len(y), folds)
    prob = np.empty(len(y), dtype=np.float64)
    for k in range(folds):
        fit_rows, score_rows = which != k, which == k
        if y[fit_rows].min() == y[fit_rows].max():
            return None
        fitted = fit_calibration(method, y[fit_rows], z[fit_rows])
        prob[score_rows] = apply_calibration(z[score_rows], fitted)
    return prob


def row_logloss(label: np.ndarray, prob: np.ndarray) -> np.ndarray:
    """Each row's log loss (probabilities clipped to [1e-7, 1 - 1e-7], as ``logloss``)."""
    y = np.asarray(label, dtype=np.float64)
    p = np.clip(np.asarray(prob, dtype=np.float64), 1e-7, 1 - 1e-7)
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


def simplest_within_one_se(losses: Mapping[str, np.ndarray], simplest_first: Sequence[str]) -> str:
    """The model to keep among candidates scored on the same validation rows: the simplest
    (first in ``simplest_first``) whose mean loss is within one standard error of the best's,
    the error being that of the per-row difference to the best (paired: the rows are shared).

    This is the one-standard-error rule of Breiman et al. (CART, 1984) and of glmnet's
    ``lambda.1se``. On a large validation split the error is small and the lowest loss wins; on
    a small one (20 rows, 5 clicks) differences of several hundredths are noise, the lowest
    value mostly says which candidate fitted those rows by chance (early stopping and tuning
    chose on them too), and the simpler model is the better bet. Candidates missing from
    ``simplest_first`` come after it, in their order in ``losses``."""
    names = [n for n in simplest_first if n in losses] + [
        n for n in losses if n not in simplest_first
    ]
    if not names:
        raise ValueError("no candidates")
    means = {n: float(np.mean(losses[n])) for n in names}
    best = min(names, key=lambda n: means[n])
    for name in names:
        gap, se = paired_gap(losses[name], losses[best])
        if gap <= se:
            return name
    return best


def paired_gap(losses: Any, best: Any) -> tuple[float, float]:
    """(mean, standard error) of the per-row difference ``losses - best``: two candidates'
    losses on the same rows, compared row by row (the one-standard-error rule's test)."""
    diff = np.asarray(losses, dtype=np.float64) - np.asarray(best, dtype=np.float64)
    se = float(np.std(diff, ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0
    return float(np.mean(diff)), se


def _feature_columns(spec) -> list[tuple[str, str, list[int]]]:
    """(ref, "dense"|"cat", column indices) for each model input."""
    result = []
    offset = 0
    for feature in spec.dense_features:
        width = feature.dim if feature.dtype == "embedding" else 1
        result.append((feature.ref, "dense", list(range(offset, offset + width))))
        offset += width
    from training.bundle import categorical_columns

    for feature, start in categorical_columns(spec):
        # A list feature's slots move together: shuffling its rows, not its items.
        result.append((feature.ref, "cat", list(range(start, start + feature.slots))))
    return result


def permutation_importance(
    model, spec, dense, cat, label, *, seed: int = 0, repeats: int = 1
) -> dict[str, float]:
    """AUC lost when one feature's values are shuffled across the held-out rows (F10)."""
    import torch

    calibration = spec.extra.get("calibration")
    y = label.cpu().numpy()
    base = auc(y, predict(model, dense, cat, calibration=calibration))
    if base is None:
        return {}
    generator = torch.Generator().manual_seed(seed)
    importance = {}
    for ref, kind, columns in _feature_columns(spec):
        drops = []
        for _ in range(repeats):
            perm = torch.randperm(int(dense.shape[0]), generator=generator)
            d, c = dense, cat
            if kind == "dense":
                d = dense.clone()
                d[:, columns] = dense[perm][:, columns]
            else:
                c = cat.clone()
                c[:, columns] = cat[perm][:, columns]
            drops.append(base - (auc(y, predict(model, d, c, calibration=calibration)) or 0.5))
        importance[ref] = round(float(np.mean(drops)), 6)
    return importance


def evaluate(model, spec, split, *, seed: int = 0, importance: bool = True) -> dict[str, Any]:
    """Everything the job page shows: summary, ROC, calibration, slices, importance; the
    model's probabilities go through ``spec.extra["calibration"]`` as the bundle's do."""
    y = split.label.cpu().numpy()
    prob = predict(model, split.dense, split.cat, calibration=spec.extra.get("calibration"))
    result: dict[str, Any] = {
        "holdout": summary(y, prob),
        "roc": roc_curve(y, prob),
        "calibration": calibration(y, prob),
    }
    if split.slices is not None:
        slices = {}
        values, counts = np.unique(split.slices.astype(str), return_counts=True)
        for value, count in sorted(zip(values, counts, strict=True), key=lambda t: -t[1])[:30]:
            if count < MIN_SLICE_ROWS:
                continue
            mask = split.slices.astype(str) == value
            slices[str(value)] = summary(y[mask], prob[mask])
        result["slices"] = slices
    if importance:
        result["importance"] = permutation_importance(
            model, spec, split.dense, split.cat, split.label, seed=seed
        )
    return result


def evaluate_bundle(bundle_path: str, job_spec) -> dict[str, Any]:
    """Score a stored bundle (e.g. the production model) on ``job_spec``'s held-out rows."""
    from training import data
    from training.bundle import load_bundle

    bundle = load_bundle(bundle_path)
    job = dataclasses.replace(
        job_spec, features=[dataclasses.asdict(f) for f in bundle.spec.features]
    )
    loaded = data.load(job, spec=bundle.spec)
    return summary(loaded.holdout.label.numpy(), predict_bundle(bundle, loaded.holdout))
