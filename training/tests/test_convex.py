"""The logreg template's convex fit (``solver: lbfgs``, its default): the same solution as
scikit-learn's ``LogisticRegression`` with C = 1 / (l2 * rows) on the same encoding, independent
of learning rate and batch order, and a penalty that changes the model."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import OneHotEncoder

from training import data, runner
from training.bundle import load_bundle

ROWS = 1500
FEATURES = [
    {"ref": "g:colour", "column": "g__colour", "dtype": "categorical", "entity": "user", "dim": 1},
    {"ref": "g:shape", "column": "g__shape", "dtype": "categorical", "entity": "item", "dim": 1},
    {"ref": "g:size", "column": "g__size", "dtype": "float", "entity": "item", "dim": 1},
]


@pytest.fixture(scope="module")
def table_path(tmp_path_factory):
    rng = np.random.default_rng(7)
    colour = rng.integers(0, 12, ROWS)
    shape = rng.integers(0, 5, ROWS)
    size = rng.normal(3.0, 2.0, ROWS)
    logit = -0.5 + 0.3 * (colour % 4) - 0.4 * (shape == 2) + 0.6 * (size - 3.0) / 2.0
    click = (rng.random(ROWS) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    start = int(datetime(2026, 11, 1, tzinfo=UTC).timestamp() * 1_000_000)
    table = pa.table(
        {
            "g__colour": pa.array([f"c{v}" for v in colour]),
            "g__shape": pa.array([f"s{v}" for v in shape]),
            "g__size": pa.array(size),
            "event_time": pa.array(
                [start + i * 1_000_000 for i in range(ROWS)], pa.timestamp("us", tz="UTC")
            ),
            "click": pa.array(click),
        }
    )
    path = tmp_path_factory.mktemp("convex") / "rows.parquet"
    pq.write_table(table, path)
    return path


def _job(path, work, **params):
    return data.JobSpec(
        job_id=1,
        template="logreg",
        dataset_path=str(path),
        features=FEATURES,
        work_dir=str(work),
        label="click",
        params={
            "threads": 1,
            "importance": False,
            "calibration": "none",
            "vocab_min_count": 1,
            **params,
        },
    )


def _train(job) -> dict:
    events: list[dict] = []
    assert runner.train(job, emit=runner.Emitter(sink=events.append)) == 0
    return next(e for e in events if e["type"] == "done")["metrics"]


def _probs(model_dir, split) -> np.ndarray:
    import torch

    model = load_bundle(model_dir).model
    with torch.inference_mode():
        return torch.sigmoid(model(split.dense, split.cat)).numpy()


def _encoded(loaded_split):
    """The model's own inputs as scikit-learn reads them: one-hot of each field's index."""
    return loaded_split.cat.numpy(), loaded_split.dense.numpy()


def test_the_convex_fit_is_scikit_learns_logistic_regression(table_path, tmp_path):
    l2 = 1e-3
    job = _job(table_path, tmp_path / "m", l2=l2)
    metrics = _train(job)
    assert metrics["solver"] == "lbfgs" and metrics["solver_iterations"] > 0
    loaded = data.load(job)
    assert metrics["validation"]["rows"] == loaded.validation.n > 0
    cat, dense = _encoded(loaded.train)
    encoder = OneHotEncoder(handle_unknown="ignore").fit(cat)
    reference = LogisticRegression(C=1.0 / (l2 * loaded.train.n), max_iter=5000, tol=1e-10)
    reference.fit(np.hstack([encoder.transform(cat).toarray(), dense]), loaded.train.label.numpy())
    test_cat, test_dense = _encoded(loaded.holdout)
    expected = reference.predict_proba(
        np.hstack([encoder.transform(test_cat).toarray(), test_dense])
    )[:, 1]
    got = _probs(job.model_dir, loaded.holdout)
    assert np.max(np.abs(got - expected)) < 2e-3


def test_the_fit_ignores_learning_rate_and_batch_size_and_the_penalty_matters(table_path, tmp_path):
    def holdout_probs(work, **params):
        job = _job(table_path, tmp_path / work, **params)
        _train(job)
        loaded = data.load(job)
        return _probs(job.model_dir, loaded.holdout)

    a = holdout_probs("a", l2=1e-3, lr=0.5, batch_size=7)
    b = holdout_probs("b", l2=1e-3, lr=0.001, batch_size=900)
    strong = holdout_probs("c", l2=1.0)
    assert np.max(np.abs(a - b)) < 1e-4
    # a heavy penalty pulls every score towards the base rate
    assert np.std(strong) < 0.5 * np.std(a)


def test_adam_stays_available(table_path, tmp_path):
    metrics = _train(_job(table_path, tmp_path / "adam", solver="adam", epochs=2))
    assert "solver" not in metrics and metrics["steps"] > 1
