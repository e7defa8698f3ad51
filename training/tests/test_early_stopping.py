"""Train / validation / test, early stopping and calibration in the training child (in-process,
no database except the API checks at the end): the test rows never choose anything, the best
validation epoch is what is saved, calibration is fitted on the validation rows and travels in
the bundle, and ECE sits beside AUC and log loss."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from training import data, evaluation, runner, synthetic
from training.bundle import apply_calibration, load_bundle


@pytest.fixture(scope="module")
def demo_parquet(tmp_path_factory):
    import django  # noqa: F401  (features.demo needs the app registry, set up by pytest-django)

    return synthetic.write_demo_dataset(tmp_path_factory.mktemp("demo") / "d.parquet", scale=0.1)


def _job(path, work, template="fine_ranking", **params):
    return data.JobSpec(
        job_id=1,
        template=template,
        dataset_path=str(path),
        features=synthetic.feature_dicts(),
        work_dir=str(work),
        label="click",
        params={"epochs": 2, "batch_size": 128, "threads": 1, "importance": False, **params},
    )


def _train(job):
    events: list[dict] = []
    assert runner.train(job, emit=runner.Emitter(sink=events.append)) == 0
    return events, next(e for e in events if e["type"] == "done")["metrics"]


def _time_ordered(path):
    columns = pq.read_schema(path).names
    return data.read_table(path, columns)


# A learning rate that overfits the small demo log within a few epochs: the validation log loss
# turns up, so patience runs out well before the last epoch.
OVERFIT = {"lr": 0.1, "epochs": 12, "early_stopping_patience": 2}


def test_validation_comes_from_the_end_of_the_train_rows_and_the_test_rows_do_not_move(
    demo_parquet, tmp_path
):
    before = data.load(_job(demo_parquet, tmp_path, validation_fraction=0.0))
    after = data.load(_job(demo_parquet, tmp_path, validation_fraction=0.25))
    n = _time_ordered(demo_parquet).num_rows
    rows = after.rows
    assert before.validation.n == 0 and after.validation.n == len(rows["validation"]) > 0
    # train | validation | test in time order, disjoint, covering every row
    assert rows["train"].max() < rows["validation"].min()
    assert rows["validation"].max() < rows["test"].min()
    assert not set(rows["validation"]) & set(rows["test"])
    assert sorted(np.concatenate(list(rows.values())).tolist()) == list(range(n))
    assert len(rows["validation"]) == np.ceil(0.25 * len(before.rows["train"]))
    # the held-out (test) rows are the same rows as without a validation split
    assert np.array_equal(before.rows["test"], rows["test"])
    assert np.array_equal(before.holdout.label.numpy(), after.holdout.label.numpy())
    assert before.train.n == after.train.n + after.validation.n


def test_early_stopping_keeps_the_best_validation_epoch(demo_parquet, tmp_path):
    job = _job(demo_parquet, tmp_path, calibration="none", **OVERFIT)
    events, metrics = _train(job)
    validation = metrics["validation"]
    curve = validation["curve"]
    assert metrics["stopped_early"] is True
    # it stopped ``patience`` epochs after the best one, before the last epoch
    assert len(curve) == metrics["best_epoch"] + 2 < OVERFIT["epochs"]
    values = [value for _, value in curve]
    assert validation["best_value"] == min(values)
    assert curve[values.index(min(values))][0] == metrics["best_epoch"]
    # the curve is emitted as the agent's metric series, one point per epoch
    series = [e for e in events if e["type"] == "metric" and e["name"] == "val_logloss"]
    assert [e["value"] for e in series] == values
    assert any(e["type"] == "metric" and e["name"] == "val_auc" for e in events)
    # the saved model is the best epoch's, not the last one's
    bundle = load_bundle(job.model_dir)
    split = data.load(job, spec=bundle.spec).validation
    prob = evaluation.predict(bundle.model, split.dense, split.cat)
    assert evaluation.logloss(split.label.numpy(), prob) == pytest.approx(min(values), abs=1e-6)
    assert values[-1] > min(values)


def test_without_patience_every_epoch_runs_and_the_last_model_is_kept(demo_parquet, tmp_path):
    params = {**OVERFIT, "early_stopping_patience": 0, "epochs": 5}
    job = _job(demo_parquet, tmp_path, calibration="none", **params)
    _, metrics = _train(job)
    assert metrics["stopped_early"] is False and metrics["best_epoch"] is None
    curve = metrics["validation"]["curve"]
    assert [epoch for epoch, _ in curve] == [1, 2, 3, 4, 5]
    bundle = load_bundle(job.model_dir)
    split = data.load(job, spec=bundle.spec).validation
    prob = evaluation.predict(bundle.model, split.dense, split.cat)
    assert evaluation.logloss(split.label.numpy(), prob) == pytest.approx(curve[-1][1], abs=1e-6)


def test_poisoned_test_labels_change_nothing_that_is_chosen(demo_parquet, tmp_path):
    """The test rows' labels flipped: the best epoch, the validation curve and the fitted
    temperature are the same, only the held-out metrics differ."""
    table = _time_ordered(demo_parquet)
    test = data.split_rows(_job(demo_parquet, tmp_path), table)["test"]
    labels = np.asarray(table.column("click").to_pylist(), dtype=bool)
    labels[test] = ~labels[test]
    poisoned_path = tmp_path / "poisoned.parquet"
    index = table.column_names.index("click")
    pq.write_table(table.set_column(index, "click", pa.array(labels)), poisoned_path)

    _, clean = _train(_job(demo_parquet, tmp_path / "clean", **OVERFIT))
    _, poisoned = _train(_job(poisoned_path, tmp_path / "poisoned", **OVERFIT))
    assert poisoned["best_epoch"] == clean["best_epoch"]
    assert poisoned["stopped_early"] == clean["stopped_early"]
    assert poisoned["validation"]["curve"] == clean["validation"]["curve"]
    assert poisoned["validation"]["temperature"] == clean["validation"]["temperature"]
    assert poisoned["holdout"]["auc"] == pytest.approx(1 - clean["holdout"]["auc"], abs=1e-9)


def test_a_resumed_run_keeps_the_early_stopping_state(demo_parquet, tmp_path):
    whole = _job(demo_parquet, tmp_path / "whole", checkpoint_every_steps=5, **OVERFIT)
    _, expected = _train(whole)

    class StopAfterEpochs(runner.StopFlag):
        """Asks to stop once two validation points (two epochs) have been emitted."""

        def __init__(self, events):
            super().__init__()
            self.events = events

        @property
        def requested(self):
            return sum(e.get("name") == "val_logloss" for e in self.events) >= 2

        @requested.setter
        def requested(self, value):
            pass

    part = _job(demo_parquet, tmp_path / "part", checkpoint_every_steps=5, **OVERFIT)
    events: list = []
    stop = StopAfterEpochs(events)
    assert runner.train(part, emit=runner.Emitter(sink=events.append), stop=stop) == 3
    _, resumed = _train(part)
    assert resumed["best_epoch"] == expected["best_epoch"]
    assert resumed["validation"]["curve"] == expected["validation"]["curve"]
    assert resumed["holdout"]["logloss"] == pytest.approx(expected["holdout"]["logloss"], abs=1e-9)


def test_temperature_and_isotonic_fix_an_overconfident_model():
    rng = np.random.default_rng(3)
    true_logit = rng.normal(-1.5, 1.0, 4000)
    y = (rng.random(4000) < 1 / (1 + np.exp(-true_logit))).astype(np.float64)
    logits = 3.0 * true_logit  # overconfident: three times too sure
    raw = apply_calibration(logits, None)
    temperature = evaluation.fit_calibration("temperature", y, logits)
    assert temperature["temperature"] == pytest.approx(3.0, rel=0.15)
    scaled = apply_calibration(logits, temperature)
    assert evaluation.logloss(y, scaled) < evaluation.logloss(y, raw) - 0.05
    assert evaluation.ece(y, scaled) < evaluation.ece(y, raw) / 2
    isotonic = evaluation.fit_calibration("isotonic", y, logits)
    mapped = apply_calibration(logits, isotonic)
    assert evaluation.logloss(y, mapped) < evaluation.logloss(y, raw) - 0.05
    assert np.all(np.diff(mapped[np.argsort(logits)]) >= 0)  # monotone: the ranking stays
    assert evaluation.fit_calibration("none", y, logits) is None


def test_ece_is_the_count_weighted_gap_over_ten_equal_width_bins():
    prob = np.array([0.05, 0.05, 0.15, 0.95, 0.95, 0.95, 0.95, 1.0])
    label = np.array([0, 1, 0, 1, 1, 1, 0, 1])
    # bins: [0,.1) 2 rows gap |.5-.05|; [.1,.2) 1 row |0-.15|; [.9,1] 5 rows |.8-.96|
    expected = (2 * 0.45 + 1 * 0.15 + 5 * abs(0.8 - 0.96)) / 8
    assert evaluation.ece(label, prob) == pytest.approx(expected)
    assert evaluation.summary(label, prob)["ece"] == pytest.approx(expected)
    assert evaluation.ece(np.zeros(0), np.zeros(0)) is None


@pytest.mark.parametrize("method", ["temperature", "isotonic"])
def test_the_calibration_fitted_on_validation_travels_in_the_bundle(demo_parquet, tmp_path, method):
    job = _job(demo_parquet, tmp_path, calibration=method, epochs=3, lr=0.05)
    _, metrics = _train(job)
    validation = metrics["validation"]
    assert validation["calibration"] == method
    assert validation["logloss"] < validation["uncalibrated_logloss"]
    assert metrics["holdout"]["ece"] is not None and validation["ece"] is not None
    bundle = load_bundle(job.model_dir)
    assert bundle.spec.extra["calibration"]["method"] == method
    # the stored bundle scores the held-out rows as the job's evaluation did
    score = evaluation.evaluate_bundle(str(job.model_dir), job)
    assert score["logloss"] == pytest.approx(metrics["holdout"]["logloss"], abs=1e-9)
    assert score["ece"] == pytest.approx(metrics["holdout"]["ece"], abs=1e-9)


def test_no_validation_means_no_stopping_and_no_calibration(demo_parquet, tmp_path):
    job = _job(demo_parquet, tmp_path, validation_fraction=0.0)
    events, metrics = _train(job)
    assert "validation" not in metrics and metrics["stopped_early"] is False
    assert not any(e.get("name", "").startswith("val_") for e in events)
    assert "calibration" not in load_bundle(job.model_dir).spec.extra


def test_a_split_column_assigns_the_rows(demo_parquet, tmp_path):
    table = _time_ordered(demo_parquet)
    n = table.num_rows
    # every third row validation, the first 200 rows test (not the newest: the user's choice)
    split = np.where(np.arange(n) % 3 == 0, "validation", "train").astype(object)
    split[:200] = "test"
    path = tmp_path / "split.parquet"
    pq.write_table(table.append_column("split", pa.array(split.tolist())), path)
    job = _job(path, tmp_path / "run", split_column="split", holdout_fraction=0.5)
    loaded = data.load(job)
    assert loaded.rows["test"].tolist() == list(range(200))
    assert loaded.holdout.n == 200 and loaded.validation.n == int((split == "validation").sum())
    assert loaded.train.n == int((split == "train").sum())
    _, metrics = _train(job)
    assert metrics["holdout"]["rows"] == 200
    assert metrics["validation"]["rows"] == loaded.validation.n


@pytest.mark.parametrize(
    ("column", "values", "message"),
    [
        ("nope", None, "the split column 'nope' is not a column of the dataset"),
        ("split", "val", "the split column 'split' holds ['val']"),
    ],
)
def test_a_bad_split_column_fails_the_run_saying_why(
    demo_parquet, tmp_path, column, values, message
):
    table = _time_ordered(demo_parquet)
    labels = ["train"] * (table.num_rows - 1) + [values or "test"]
    path = tmp_path / "split.parquet"
    pq.write_table(table.append_column("split", pa.array(labels)), path)
    events: list[dict] = []
    job = _job(path, tmp_path / "run", split_column=column)
    assert runner.train(job, emit=runner.Emitter(sink=events.append)) == 2
    errors = [e["message"] for e in events if e["type"] == "error"]
    assert len(errors) == 1 and errors[0].startswith(message)
    assert not job.model_dir.exists()


def test_early_stopping_by_auc_counts_higher_as_better_and_no_auc_as_no_gain():
    model = torch.nn.Linear(1, 1)
    stopping = runner.EarlyStopping(metric="auc", patience=2)
    for epoch, value in enumerate([0.6, 0.7, None, 0.65, 0.8], start=1):
        if not stopping.stopped:
            with torch.no_grad():
                model.bias.fill_(epoch)
            stopping.update(epoch, value, model)
    assert stopping.stopped and stopping.best_epoch == 2 and stopping.best_value == 0.7
    assert float(stopping.best_state["bias"]) == 2.0
    assert [epoch for epoch, _ in stopping.curve] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="early_stopping_metric"):
        runner.EarlyStopping(metric="ndcg", patience=2)
