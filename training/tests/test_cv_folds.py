"""``cv_folds``: k-fold cross-fitting. The train and validation rows are pooled and dealt into k
folds; fold i's model never trains on fold i (it stops early on fold i + 1 where it stops early
at all); the bundle averages the k models; the run's validation metrics and calibration are out
of fold (every pooled row scored by the model that did not see it); the test rows never move."""

from __future__ import annotations

import numpy as np
import pytest

from training import data, evaluation, runner, synthetic
from training.bundle import apply_calibration, load_bundle
from training.params import job_params_check
from training.templates.inputs import Averaged
from training.templates.lightgbm import LightGBMModel, average_model_text
from training.tests.factories import demo_job_spec, run_spec

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def demo_parquet(tmp_path_factory):
    import django  # noqa: F401  (features.demo needs the app registry, set up by pytest-django)

    return synthetic.write_demo_dataset(tmp_path_factory.mktemp("cv") / "d.parquet", scale=0.05)


def _job(path, work, template="fine_ranking", **params):
    return demo_job_spec(path, work, template, **{"epochs": 2, "batch_size": 128, **params})


def test_each_fold_trains_on_the_others_and_the_test_rows_never_move(demo_parquet, tmp_path):
    plain = data.split_rows(_job(demo_parquet, tmp_path), _table(demo_parquet))
    pool = np.sort(np.concatenate([plain["train"], plain["validation"]]))
    which = data.cv_fold_of(len(pool), 4)
    fold_rows = [pool[which == i] for i in range(4)]
    # The folds cover the pool once, each about a quarter of it.
    assert max(len(f) for f in fold_rows) - min(len(f) for f in fold_rows) <= 1
    for template, params in (("fine_ranking", {}), ("lightgbm", {}), ("logreg", {})):
        job = _job(demo_parquet, tmp_path, template, cv_folds=4, **params)
        stops = data.stops_early(job)
        assert stops == (template != "logreg")  # logreg's convex fit stops on nothing
        for fold in range(4):
            job.params["cv_fold"] = fold
            rows = data.split_rows(job, _table(demo_parquet))
            assert np.array_equal(rows["test"], plain["test"])
            assert not set(rows["train"]) & set(rows["validation"])
            # Fold i is never trained on: its out-of-fold predictions are clean.
            assert not set(rows["train"]) & set(fold_rows[fold])
            if stops:
                # ... nor stopped on: the member stops on the next fold, trains on the rest.
                stop_on = fold_rows[(fold + 1) % 4]
                assert np.array_equal(rows["validation"], stop_on)
                rest = np.setdiff1d(pool, np.concatenate([fold_rows[fold], stop_on]))
                assert np.array_equal(rows["train"], rest)
            else:
                assert np.array_equal(rows["validation"], fold_rows[fold])
                assert np.array_equal(rows["train"], np.setdiff1d(pool, fold_rows[fold]))
    # Without early stopping the minibatch loop trains on the k - 1 other folds too.
    unstopped = _job(demo_parquet, tmp_path, cv_folds=4, cv_fold=0, early_stopping_patience=0)
    assert not data.stops_early(unstopped)
    assert not data.stops_early(_job(demo_parquet, tmp_path, "lightgbm", early_stopping_rounds=0))
    assert data.stops_early(_job(demo_parquet, tmp_path, "logreg", solver="adam"))
    assert np.array_equal(
        data.split_rows(unstopped, _table(demo_parquet))["train"], np.setdiff1d(pool, fold_rows[0])
    )
    # The run itself trains on nothing: its train rows are the pool, its validation none.
    run = data.split_rows(_job(demo_parquet, tmp_path, cv_folds=3), _table(demo_parquet))
    assert np.array_equal(run["train"], pool) and not len(run["validation"])


def _table(path):
    columns = [f["column"] for f in _job(path, "x").features] + ["click"]
    return data.read_table(str(path), columns)


@pytest.mark.parametrize("template", ["fine_ranking", "logreg"])
def test_the_validation_metrics_are_out_of_fold_over_the_whole_pool(
    demo_parquet, tmp_path, template
):
    job = _job(demo_parquet, tmp_path / "cv", template, cv_folds=3)
    code, events = run_spec(job)
    assert code == 0, [e for e in events if e["type"] in ("error", "log")]
    bundle = load_bundle(job.model_dir)
    assert isinstance(bundle.model, Averaged) and len(bundle.model.members) == 3
    done = next(e for e in events if e["type"] == "done")["metrics"]
    plain = data.load(_job(demo_parquet, tmp_path / "plain", template))
    pooled = plain.train.n + plain.validation.n
    assert done["cv_folds"] == 3 and done["validation"]["rows"] == pooled
    assert done["holdout"]["rows"] == plain.holdout.n
    # Recomputed by hand: each member scores its own fold (the rows it neither trained nor
    # stopped on), the pool being the run's own train rows.
    whole = data.load(_job(demo_parquet, tmp_path / "whole", template, cv_folds=3)).train
    logits, labels = np.empty(pooled), np.empty(pooled)
    for i, member in enumerate(bundle.model.members):
        fold = data.load(_job(demo_parquet, tmp_path / f"f{i}", template, cv_folds=3, cv_fold=i))
        assert fold.spec.features == bundle.spec.features  # one encoding for all the members
        rows = np.flatnonzero(np.arange(pooled) % 3 == i)
        logits[rows] = evaluation.predict_logits(member, whole.dense[rows], whole.cat[rows])
        labels[rows] = whole.label.numpy()[rows]
    fitted = bundle.spec.extra["calibration"]
    assert fitted == evaluation.fit_calibration("temperature", labels, logits)
    expected = evaluation.summary(labels, apply_calibration(logits, fitted))
    assert done["validation"]["logloss"] == pytest.approx(expected["logloss"], abs=1e-9)
    # Out of fold is not what the average scores on rows it trained on.
    pool = data.load(job).train
    averaged = evaluation.predict_logits(bundle.model, pool.dense, pool.cat)
    assert not np.allclose(averaged, logits, atol=1e-4)
    # The tuner caps its trials by the rows the run validates on, which the start reports.
    start = next(e for e in events if e["type"] == "start")
    assert abs(start["validation_rows"] - pooled) < 3


def test_cv_folds_is_checked_and_does_not_combine_with_members():
    cleaned, errors = job_params_check(template="deepfm", params={"cv_folds": 5})
    assert cleaned == {"cv_folds": 5} and not errors
    _, errors = job_params_check(template="fine_ranking", params={"cv_folds": 21})
    assert "params.cv_folds" in errors
    _, errors = job_params_check(template="two_tower", params={"cv_folds": 3})
    assert "Unknown param" in errors["params.cv_folds"]
    _, errors = job_params_check(template="fine_ranking", params={"cv_folds": 3, "members": 2})
    assert "members" in errors["params.cv_folds"]
    _, errors = job_params_check(template="fine_ranking", params={"cv_folds": 1, "members": 2})
    assert not errors  # 0 or 1 fold: off


# A run given both anyway (a spec written without the API in front) refuses, naming them.


def test_a_run_given_cv_folds_and_members_refuses(demo_parquet, tmp_path):
    code, events = run_spec(_job(demo_parquet, tmp_path, cv_folds=2, members=2))
    assert code == 2
    assert "cv_folds and members" in next(e for e in events if e["type"] == "error")["message"]


def test_a_cross_fitted_lightgbm_model_is_one_booster_scoring_the_folds_mean(
    demo_parquet, tmp_path
):
    job = _job(demo_parquet, tmp_path / "cv", "lightgbm", cv_folds=3, num_boost_round=20)
    code, events = run_spec(job)
    assert code == 0, [e for e in events if e["type"] in ("error", "log")]
    bundle = load_bundle(job.model_dir)
    assert isinstance(bundle.model, LightGBMModel)
    folds = [load_bundle(tmp_path / "cv" / f"member-{i}" / "model").model for i in range(3)]
    assert bundle.model.num_trees == sum(m.num_trees for m in folds) > 3
    holdout = data.load(job).holdout
    each = [evaluation.predict_logits(m, holdout.dense, holdout.cat) for m in folds]
    got = evaluation.predict_logits(bundle.model, holdout.dense, holdout.cat)
    assert np.allclose(got, np.mean(each, axis=0), rtol=0, atol=1e-5)  # float32 logits
    # The out-of-fold logits the run saved are the folds' own, on the rows each left out.
    saved = np.load(tmp_path / "cv" / runner.OUT_OF_FOLD_FILE)
    pool = data.load(job).train
    assert np.array_equal(saved["positions"], data.load(job).rows["train"])
    for i, model in enumerate(folds):
        rows = np.flatnonzero(np.arange(pool.n) % 3 == i)
        own = evaluation.predict_logits(model, pool.dense[rows], pool.cat[rows])
        assert np.allclose(saved["logit"][rows], own, atol=1e-6)
    done = next(e for e in events if e["type"] == "done")["metrics"]
    assert done["validation"]["rows"] == pool.n == len(saved["label"])


def test_the_averaged_text_model_is_the_mean_of_boosters_trained_apart():
    import lightgbm as lgb

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 5))
    y = (x[:, 0] - x[:, 1] + rng.normal(size=400) > 0).astype(float)
    boosters = [
        lgb.train(
            {"objective": "binary", "verbosity": -1, "num_leaves": 5 + i, "seed": i},
            lgb.Dataset(x[i * 60 :], y[i * 60 :]),
            num_boost_round=4 + 3 * i,
        )
        for i in range(3)
    ]
    merged = lgb.Booster(
        model_str=average_model_text([b.model_to_string(num_iteration=-1) for b in boosters])
    )
    mean = np.mean([b.predict(x, raw_score=True) for b in boosters], axis=0)
    assert merged.num_trees() == sum(b.num_trees() for b in boosters)
    assert np.allclose(merged.predict(x, raw_score=True), mean, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="no models"):
        average_model_text([])
