"""The blend of trained models (``training.ensemble``) and the cross-fitted validation log loss
(``training.evaluation.crossfit_logloss``) that model selection reads."""

from __future__ import annotations

import numpy as np
import pytest

from training import ensemble, evaluation


def _members(n: int, seed: int = 0):
    """A label from a true logit, and three members: two that each see the truth through their
    own independent noise (so their blend sees it better), and one that is pure noise."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(0.0, 1.5, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-truth))).astype(np.float64)
    probs = {
        "a": 1 / (1 + np.exp(-(truth + rng.normal(0, 1.5, n)) * 0.5)),
        "b": 1 / (1 + np.exp(-(truth + rng.normal(0, 1.5, n)) * 0.5)),
        "noise": 1 / (1 + np.exp(-rng.normal(0, 0.5, n))),
    }
    return y, probs


def test_a_blend_fitted_on_validation_beats_each_member_on_new_rows():
    y_val, val = _members(4000, seed=1)
    y_test, test = _members(4000, seed=2)
    blend = ensemble.fit_blend(y_val, val)
    assert sum(blend.weights.values()) == pytest.approx(1.0)
    assert all(w >= 0 for w in blend.weights.values())
    # Many rows: the fitted weights are kept, and the noise member has next to none.
    assert blend.lam == 1.0
    assert blend.weights["noise"] < 0.05
    blended = blend.predict(test)
    for name in ("a", "b"):
        assert evaluation.logloss(y_test, blended) < evaluation.logloss(y_test, test[name])
        assert evaluation.auc(y_test, blended) > evaluation.auc(y_test, test[name])
    assert blend.crossfit_logloss is not None
    assert blend.crossfit_logloss < min(evaluation.logloss(y_val, val[n]) for n in ("a", "b"))


def test_few_validation_rows_shrink_the_blend_towards_the_plain_average():
    y, probs = _members(1000, seed=3)
    assert ensemble.fit_blend(y, probs).lam > 0  # enough clicks to fit two free weights
    few = np.arange(1000) < 30
    y, probs = y[few], {k: v[few] for k, v in probs.items()}
    assert min(y.sum(), 30 - y.sum()) < ensemble.EVENTS_PER_WEIGHT * 2
    blend = ensemble.fit_blend(y, probs)
    assert blend.lam == 0.0
    assert blend.weights == pytest.approx({"a": 1 / 3, "b": 1 / 3, "noise": 1 / 3})
    assert blend.fitted_weights != blend.weights
    assert blend.crossfit_logloss == pytest.approx(evaluation.logloss(y, blend.predict(probs)))


def test_a_blend_needs_every_member_at_prediction():
    y, probs = _members(200)
    blend = ensemble.fit_blend(y, probs)
    with pytest.raises(ValueError, match="noise"):
        blend.predict({"a": probs["a"], "b": probs["b"]})
    with pytest.raises(ValueError, match="at least one member"):
        ensemble.fit_blend(y, {})


def test_the_crossfit_log_loss_does_not_flatter_a_calibration_that_memorises():
    """Isotonic calibration of logits that carry no signal fits the validation rows it is scored
    on (the in-sample log loss falls below the base rate's); cross-fitted, it does not."""
    rng = np.random.default_rng(0)
    y = (rng.random(60) < 0.3).astype(np.float64)
    logits = rng.normal(0, 1, 60)
    fitted = evaluation.fit_calibration("isotonic", y, logits)
    from training.bundle import apply_calibration

    in_sample = evaluation.logloss(y, apply_calibration(logits, fitted))
    base_rate = evaluation.logloss(y, np.full(60, y.mean()))
    crossfit = evaluation.crossfit_logloss("isotonic", y, logits)
    assert in_sample < base_rate < crossfit


def test_the_crossfit_log_loss_needs_both_classes_in_each_fitting_fold():
    assert evaluation.crossfit_logloss("temperature", np.array([1.0, 0, 1, 0]), np.zeros(4)) is None
    assert evaluation.crossfit_logloss("temperature", np.array([1.0, 0]), np.zeros(2)) is None
    y = np.array([1.0, 0, 0, 1, 0, 1, 1, 0])
    value = evaluation.crossfit_logloss("temperature", y, np.linspace(-1, 1, 8))
    assert value is not None and np.isfinite(value)
