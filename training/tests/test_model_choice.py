"""``simplest_within_one_se``: among candidates scored on the same validation rows, the simplest
within one standard error of the best; ``crossfit_probabilities`` behind ``crossfit_logloss``."""

from __future__ import annotations

import numpy as np
import pytest

from training.evaluation import (
    crossfit_logloss,
    crossfit_probabilities,
    logloss,
    row_logloss,
    simplest_within_one_se,
)

pytestmark = pytest.mark.django_db  # the suite's autouse fixtures may touch the database

ORDER = ("logreg", "lightgbm", "deepfm")


def _losses(rows: int, gain: float, seed: int = 0) -> dict[str, np.ndarray]:
    """Per-row losses: deepfm better than logreg by ``gain`` on average, with row noise."""
    rng = np.random.default_rng(seed)
    base = rng.exponential(0.6, rows)
    noise = rng.normal(0.0, 0.3, rows)
    return {"deepfm": base - gain + noise, "logreg": base, "lightgbm": base + 0.05}


def test_a_clear_gain_on_many_rows_picks_the_flexible_model():
    assert simplest_within_one_se(_losses(10_000, 0.02), ORDER) == "deepfm"


def test_a_gain_inside_the_noise_keeps_the_simplest():
    losses = _losses(20, 0.02)
    assert np.mean(losses["deepfm"]) < np.mean(losses["logreg"])  # lower, but not by 1 SE
    assert simplest_within_one_se(losses, ORDER) == "logreg"
    # The same gain measured on 10,000 rows is trusted.
    assert simplest_within_one_se(_losses(10_000, 0.02, seed=1), ORDER) == "deepfm"


def test_the_order_decides_among_equals_and_unknown_names_come_last():
    same = np.linspace(0.1, 1.0, 50)
    assert simplest_within_one_se({"deepfm": same, "lightgbm": same}, ORDER) == "lightgbm"
    assert simplest_within_one_se({"other": same, "deepfm": same}, ORDER) == "deepfm"
    with pytest.raises(ValueError, match="no candidates"):
        simplest_within_one_se({}, ORDER)


def test_crossfit_probabilities_are_what_crossfit_logloss_scores():
    rng = np.random.default_rng(3)
    y = (rng.random(200) < 0.3).astype(float)
    z = 2.0 * (y - 0.5) + rng.normal(0, 1, 200)
    prob = crossfit_probabilities("temperature", y, z)
    assert prob is not None and prob.shape == (200,)
    assert crossfit_logloss("temperature", y, z) == pytest.approx(logloss(y, prob))
    assert np.mean(row_logloss(y, prob)) == pytest.approx(logloss(y, prob), rel=1e-9)
    assert crossfit_probabilities("temperature", y[:3], z[:3]) is None
