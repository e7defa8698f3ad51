"""The Django-free tuner core (``training.tuner``): search spaces checked against the template's
params, a study rebuilt from the record asks the same next params, the pruner's decision, the
objective built from validation only, and ``optimise`` in-process."""

from __future__ import annotations

import dataclasses

import pytest

from training import data, runner, synthetic, tuner
from training.tests.factories import demo_job_spec
from training.tuner import SpaceError, TrialRecord


@pytest.fixture(scope="module")
def demo_parquet(tmp_path_factory):
    import django  # noqa: F401  (the app registry, set up by pytest-django)

    return synthetic.write_demo_dataset(tmp_path_factory.mktemp("tune") / "d.parquet", scale=0.05)


def _spec(path, work, template="logreg", **params):
    # logreg trains by Adam epochs here (its default is the one-shot convex fit), so trials have
    # the per-epoch curves pruning reads.
    return demo_job_spec(
        path, work, template, job_id=0,
        **{**({"solver": "adam"} if template == "logreg" else {}), "epochs": 2,
           "batch_size": 256, **params},
    )  # fmt: skip


# --- spaces ------------------------------------------------------------------------------------


@pytest.mark.parametrize("template", ["logreg", "fine_ranking", "deepfm", "two_tower"])
def test_each_default_space_is_allowed_by_its_templates_params(template):
    space = tuner.default_space(template)
    # logreg's convex fit has no learning rate: its penalty is what there is to tune
    assert ("l2" if template == "logreg" else "lr") in space
    again = tuner.space_from_json(template, tuner.space_to_json(space))
    assert again == space


def test_the_deepfm_space_searches_its_own_params():
    space = tuner.default_space("deepfm")
    assert {"embedding_dim", "hidden", "dropout", "embedding_l2"} <= set(space)
    assert [256, 128] in space["hidden"].choices


def test_a_user_space_is_normalised_by_the_schema():
    space = tuner.space_from_json(
        "fine_ranking",
        {
            "lr": {"low": 1e-4, "high": 0.1, "log": True},
            "cross_layers": {"low": 1, "high": 3},
            "hidden": {"choices": ["64,32", [128, 64]]},
        },
    )
    assert space["lr"].kind == "float" and space["lr"].log
    assert space["cross_layers"].kind == "int"
    assert space["hidden"].choices == ([64, 32], [128, 64])


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        ({"learning_rate": {"low": 0.1, "high": 0.2}}, "space.learning_rate", "unknown param"),
        ({"lr": {"low": 0.1, "high": 20.0}}, "space.lr", "high 20.0"),
        ({"lr": {"low": 0.2, "high": 0.1}}, "space.lr", "must be below"),
        ({"lr": {"low": 0.0, "high": 0.1, "log": True}}, "space.lr", "low > 0"),
        ({"embedding_dim": {"choices": [8, 0]}}, "space.embedding_dim", "choice 0"),
        ({"embedding_dim": {"choices": []}}, "space.embedding_dim", "choices"),
        ({"dropout": {"low": 0.1}}, "space.dropout", "low and high"),
        ({"dropout": {"low": 0.1, "high": 0.2, "step": 1}}, "space.dropout", "unknown key"),
        ({"cross_layers": {"low": 0.5, "high": 2}}, "space.cross_layers", "whole number"),
        ({"calibration": {"low": 0, "high": 1}}, "space.calibration", "takes choices"),
        ({"scheduler": {"choices": [{}]}}, "space.scheduler", "object param"),
    ],
)
def test_a_bad_space_names_the_param(spec, field, says):
    with pytest.raises(SpaceError) as caught:
        tuner.space_from_json("fine_ranking", spec)
    assert field in caught.value.errors
    assert says in caught.value.errors[field]


def test_an_empty_space_is_refused():
    with pytest.raises(SpaceError) as caught:
        tuner.space_from_json("logreg", {})
    assert "space" in caught.value.errors


def test_lightgbm_bags_when_its_bagging_fraction_is_below_one():
    assert tuner.derived_params("lightgbm", {"bagging_fraction": 0.7})["bagging_freq"] == 1
    assert "bagging_freq" not in tuner.derived_params("lightgbm", {"bagging_fraction": 1.0})
    assert "bagging_freq" not in tuner.derived_params("logreg", {"bagging_fraction": 0.7})


# --- the study ---------------------------------------------------------------------------------


SPACE = tuner.space_from_json(
    "fine_ranking",
    {"lr": {"low": 1e-4, "high": 0.1, "log": True}, "hidden": {"choices": [[64, 32], [32]]}},
)


def _record(n: int, value: float | None = None, state: str = "complete", **kw) -> TrialRecord:
    params = tuner.ask(SPACE, [], seed=n)
    return TrialRecord(number=n, params=params, state=state, value=value, **kw)


def test_a_rebuilt_study_asks_the_same_params_and_a_new_trial_count_moves_on():
    trials = [_record(i, 0.5 + 0.01 * i) for i in range(6)]
    first = tuner.ask(SPACE, trials, seed=7)
    assert tuner.ask(SPACE, list(trials), seed=7) == first  # a restarted controller
    assert tuner.ask(SPACE, trials, seed=8) != first
    following = tuner.ask(SPACE, [*trials, TrialRecord(6, first)], seed=7)
    assert following != first  # the running trial is in the study: no repeat
    assert first["hidden"] in ([64, 32], [32]) and 1e-4 <= first["lr"] <= 0.1


def test_the_median_pruner_stops_a_trial_worse_than_the_finished_ones():
    finished = [
        _record(0, 0.40, intermediate={1: 0.45, 2: 0.40}),
        _record(1, 0.42, intermediate={1: 0.46, 2: 0.42}),
    ]
    pruner = tuner.PrunerConfig(kind="median", n_startup_trials=2, warmup_epochs=0)
    bad = TrialRecord(2, finished[0].params, intermediate={1: 0.70})
    good = TrialRecord(2, finished[0].params, intermediate={1: 0.44})
    assert tuner.prune_decision(SPACE, [*finished, bad], 2, pruner=pruner)[0] is True
    assert tuner.prune_decision(SPACE, [*finished, good], 2, pruner=pruner)[0] is False
    # AUC is maximised: the same low number is now the bad one.
    auc_finished = [dataclasses.replace(t, value=0.7, intermediate={1: 0.7}) for t in finished]
    low = TrialRecord(2, finished[0].params, intermediate={1: 0.6})
    assert tuner.prune_decision(SPACE, [*auc_finished, low], 2, metric="auc", pruner=pruner)[0]
    # Before n_startup_trials have finished, nothing is pruned.
    assert not tuner.prune_decision(SPACE, [finished[0], bad], 2, pruner=pruner)[0]
    assert not tuner.prune_decision(
        SPACE, [*finished, bad], 2, pruner=tuner.PrunerConfig(kind="none")
    )[0]


def test_asha_keeps_its_rungs_in_the_pruner_attrs():
    """ASHA's rungs live in each trial's attrs: a trial checked while it ran carries them into
    later studies, where a worse trial at the same rung is stopped."""
    pruner = tuner.PrunerConfig(kind="asha", warmup_epochs=0)
    finished: list[TrialRecord] = []
    for n in range(3):
        running = _record(n, None, "running", intermediate={1: 0.4})
        _, attrs = tuner.prune_decision(SPACE, [*finished, running], n, pruner=pruner)
        assert any("rung" in key for key in attrs)
        finished.append(dataclasses.replace(running, state="complete", value=0.4,
                                            pruner_attrs=attrs))  # fmt: skip
    worse = TrialRecord(3, finished[0].params, intermediate={1: 0.9})
    assert tuner.prune_decision(SPACE, [*finished, worse], 3, pruner=pruner)[0] is True
    better = TrialRecord(3, finished[0].params, intermediate={1: 0.1})
    assert tuner.prune_decision(SPACE, [*finished, better], 3, pruner=pruner)[0] is False


def test_the_best_trial_follows_the_metrics_direction():
    trials = [_record(0, 0.5), _record(1, 0.3), _record(2, None, "failed"), _record(3, 0.3)]
    assert tuner.best_trial(trials, "logloss").number == 1
    assert tuner.best_trial(trials, "auc").number == 0
    assert tuner.best_trial([_record(0, None, "pruned")], "logloss") is None


def test_simplicity_runs_from_the_complex_end_to_the_simple_end_of_each_directed_param():
    space = tuner.default_space("fine_ranking")
    simplest = {"embedding_dim": 4, "cross_layers": 0, "hidden": [64, 32], "dropout": 0.5,
                "weight_decay": 1e-3, "lr": 0.1}  # fmt: skip
    most_complex = {"embedding_dim": 32, "cross_layers": 3, "hidden": [256, 128],
                    "dropout": 0.0, "weight_decay": 1e-8, "lr": 1e-4}  # fmt: skip
    assert tuner.simplicity(simplest, space) == pytest.approx(1.0)
    assert tuner.simplicity(most_complex, space) == pytest.approx(0.0)
    # the learning rate has no direction: it does not move the score
    assert tuner.simplicity({**simplest, "lr": 1e-4}, space) == pytest.approx(1.0)
    # a log range is measured on the log scale: l2 1e-3 is half way along 1e-7..10
    logreg = tuner.default_space("logreg")
    halfway = tuner.simplicity({"l2": 1e-3, "vocab_min_count": 2}, logreg)
    assert halfway == pytest.approx(0.5)
    assert tuner.simplicity({"lr": 0.1}, {"lr": space["lr"]}) == 0.0


def _shift(gap, noise, n, seed):
    """Per-row differences of mean ``gap`` exactly and spread ``noise``."""
    import numpy as np

    rows = np.random.default_rng(seed).normal(0.0, noise, size=n)
    return rows - rows.mean() + gap


def test_the_kept_trial_is_the_simplest_within_one_standard_error_of_the_lowest_loss():
    import numpy as np

    space = tuner.default_space("logreg")
    base = np.abs(np.random.default_rng(0).normal(0.5, 0.4, size=200))
    trials = [
        TrialRecord(0, {"l2": 1e-4, "vocab_min_count": 1}, "complete"),  # weak penalty
        TrialRecord(1, {"l2": 1.0, "vocab_min_count": 2}, "complete"),  # strong penalty
        TrialRecord(2, {"l2": 5.0, "vocab_min_count": 3}, "complete"),  # strongest
        TrialRecord(3, {"l2": 9.0, "vocab_min_count": 3}, "failed"),
    ]
    # trial 1 is a little worse than trial 0, well within the noise of their difference;
    # trial 2 is clearly worse (its gap is many times its error)
    rows = {0: base, 1: base + _shift(0.01, 0.3, 200, 1), 2: base + 0.2}
    trials = [
        dataclasses.replace(t, value=float(np.mean(rows[t.number])) if t.number in rows else None)
        for t in trials
    ]
    kept = tuner.chosen_trial(trials, "logloss", space, rows)
    assert kept.lowest.number == 0 and kept.trial.number == 1
    assert "one standard error" in kept.reason
    # the same trials without their rows, or tuned on AUC: the lowest (best) value
    assert tuner.chosen_trial(trials, "logloss", space, {}).trial.number == 0
    assert tuner.chosen_trial(trials, "auc", space, rows).trial.number == 2
    # a simpler trial outside one standard error is not kept
    far = {**rows, 1: base + 0.05}
    assert tuner.chosen_trial(trials, "logloss", space, far).trial.number == 0
    # rows of another length (not the same rows) are not compared
    other = {**rows, 1: rows[1][:100]}
    assert tuner.chosen_trial(trials, "logloss", space, other).trial.number == 0
    assert tuner.chosen_trial([trials[3]], "logloss", space, rows) is None


def test_importances_need_two_distinct_finished_trials():
    assert tuner.param_importances(SPACE, [_record(0, 0.5)], metric="logloss") == {}
    trials = [_record(i, 0.3 + 0.05 * i) for i in range(5)]
    importances = tuner.param_importances(SPACE, trials, metric="logloss")
    assert set(importances) == {"lr", "hidden"}
    assert sum(importances.values()) == pytest.approx(1.0)


# --- validation only ---------------------------------------------------------------------------


def test_a_trial_record_has_no_place_for_a_held_out_metric():
    names = {f.name for f in dataclasses.fields(TrialRecord)}
    assert names == {"number", "params", "state", "value", "intermediate", "pruner_attrs"}
    with pytest.raises(TypeError):
        TrialRecord(0, {}, holdout={"auc": 0.9})  # type: ignore[call-arg]


def test_the_objective_reads_the_validation_block_only():
    metrics = {"validation": {"logloss": 0.41, "auc": 0.7}, "holdout": {"logloss": 0.1}}
    assert tuner.validation_value(metrics["validation"], "logloss") == 0.41
    assert tuner.validation_value(metrics["validation"], "auc") == 0.7
    assert tuner.validation_value(None, "auc") is None
    assert tuner.validation_curve([(20, 0.5), (10, 0.6), (30, float("nan"))]) == {1: 0.6, 2: 0.5}


def test_the_log_loss_objective_is_the_crossfit_one_where_the_run_reports_it():
    block = {"logloss": 0.41, "crossfit_logloss": 0.45, "auc": 0.7}
    assert tuner.validation_value(block, "logloss") == 0.45
    assert tuner.validation_value({**block, "crossfit_logloss": None}, "logloss") == 0.41
    assert tuner.validation_value(block, "auc") == 0.7


def test_the_trial_budget_shrinks_with_the_validation_rows():
    assert tuner.trial_budget(40, 20) == tuner.MIN_TRIALS
    assert tuner.trial_budget(40, 100) == 100 // tuner.VALIDATION_ROWS_PER_TRIAL
    assert tuner.trial_budget(40, 10_000) == 40
    assert tuner.trial_budget(3, 20) == 3
    assert tuner.trial_budget(40, None) == 40


# --- in-process optimisation -------------------------------------------------------------------


def test_optimise_runs_the_trials_and_keeps_the_best_model(demo_parquet, tmp_path):
    result = tuner.optimise(
        _spec(demo_parquet, tmp_path / "base"),
        n_trials=4,
        # Adam's learning rate (logreg's default space is its convex fit's penalty)
        space=tuner.space_from_json("logreg", {"lr": {"low": 1e-3, "high": 0.3, "log": True}}),
        metric="logloss",
        seed=3,
        work_root=tmp_path / "trials",
        threads=1,
        pruner="none",
    )
    assert len(result.trials) == 4
    assert [t.number for t in result.trials] == [0, 1, 2, 3]
    assert all(t.state == "complete" and t.value is not None for t in result.trials)
    # lr has no simpler end: the kept trial is the lowest-loss one
    assert result.best_value == min(t.value for t in result.trials)
    assert "lowest validation logloss" in result.chosen_because
    assert result.best_params == result.trials[result.best_number].params
    # each trial left its validation rows' scores, whose mean is its value
    for trial in result.trials:
        rows = runner.selection_row_losses(tmp_path / "trials" / f"trial-{trial.number}")
        assert rows is not None and len(rows) > 0
        assert float(rows.mean()) == pytest.approx(trial.value, rel=1e-4)
    assert (tmp_path / "trials" / f"trial-{result.best_number}" / "model" / "spec.json").exists()
    assert result.best_model_dir.endswith(f"trial-{result.best_number}/model")
    assert len({t.params["lr"] for t in result.trials}) == 4
    assert all(set(t.intermediate) == {1, 2} for t in result.trials)


def test_optimise_prunes_at_an_epoch_boundary(demo_parquet, tmp_path):
    """A trial whose learning rate makes the first epoch's validation loss far worse than the
    finished trials' stops at that epoch."""
    space = tuner.space_from_json("logreg", {"lr": {"choices": [0.01, 0.3]}})
    result = tuner.optimise(
        _spec(demo_parquet, tmp_path / "base", epochs=3, early_stopping_patience=0),
        n_trials=6,
        space=space,
        seed=0,
        work_root=tmp_path / "trials",
        threads=1,
        pruner=tuner.PrunerConfig(kind="median", n_startup_trials=2, warmup_epochs=0),
    )
    states = {t.state for t in result.trials}
    assert "complete" in states
    pruned = [t for t in result.trials if t.state == "pruned"]
    assert pruned  # lr 0.01 learns far slower than 0.3 here: its first epoch is behind
    for trial in pruned:
        assert len(trial.intermediate) < 3 and trial.value is not None
    assert result.best_number is not None
    assert result.trials[result.best_number].state == "complete"


def test_optimise_takes_a_json_space_and_stops_at_its_time_budget(demo_parquet, tmp_path):
    result = tuner.optimise(
        _spec(demo_parquet, tmp_path / "base", epochs=1),
        n_trials=50,
        timeout_s=0.0,
        space={"lr": {"low": 0.001, "high": 0.1, "log": True}},
        work_root=tmp_path / "trials",
    )
    assert result.trials == [] and result.best_number is None and result.best_model_dir == ""


def test_optimise_runs_fewer_trials_on_a_tiny_validation_split(demo_parquet, tmp_path):
    """A handful of validation rows: the study stops at ``trial_budget``."""
    spec = _spec(demo_parquet, tmp_path / "base", epochs=1, validation_fraction=0.001)
    loaded = data.load(spec)
    rows = loaded.validation.n
    assert rows < tuner.MIN_TRIALS * tuner.VALIDATION_ROWS_PER_TRIAL
    result = tuner.optimise(
        spec, n_trials=12, work_root=tmp_path / "trials", threads=1, pruner="none"
    )
    assert len(result.trials) == tuner.MIN_TRIALS


@pytest.mark.parametrize("template", ["logreg", "lightgbm"])
def test_a_run_reports_the_crossfit_log_loss_the_objective_reads(demo_parquet, tmp_path, template):
    from training import runner

    events: list[dict] = []
    spec = _spec(demo_parquet, tmp_path / "run", template=template, epochs=1)
    assert runner.train(spec, emit=runner.Emitter(sink=events.append)) == 0
    validation = next(e for e in events if e["type"] == "done")["metrics"]["validation"]
    crossfit = validation["crossfit_logloss"]
    assert crossfit is not None and crossfit != validation["logloss"]
    assert tuner.validation_value(validation, "logloss") == crossfit
