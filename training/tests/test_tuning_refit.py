"""A tuning job's refit (``refit_cv_folds``): when the trials are done, the best trial's params
train once more with ``cv_folds`` and that job's model is the one registered; the refit's end
wakes the tuning job; a refit that fails fails the tuning job saying so; cancelling stops it.
Real training children, run by the node agent in this process (as ``test_tuning``)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from serving.models import ModelVersion
from training import agent, tuning
from training.models import JobState, TrainingJob, TuningJob, TuningState
from training.services import job_transition
from training.tests.factories import make_demo_dataset, make_node, place
from training.tests.test_tuning import FIXED, LR, _create, _run_pending, _trials
from workspaces.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def dataset(workspace):
    return make_demo_dataset(workspace, scale=0.03)


def _refit_job(tj: TuningJob) -> TrainingJob | None:
    tj.refresh_from_db()
    return tj.refit_job


def _run(job: TrainingJob, node) -> str:
    if job.state == JobState.PENDING:
        place(job, node)
    return agent.execute_job(job.pk)


def test_bad_refit_input_names_the_field(workspace, dataset):
    cases = [
        ({"refit_cv_folds": 50}, "from 0 to 20"),
        ({"refit_cv_folds": "five"}, "whole number"),
        ({"refit_cv_folds": 3, "params": {**FIXED, "cv_folds": 3}}, "cross-fitted already"),
        ({"refit_cv_folds": 3, "space": {**LR, "cv_folds": {"choices": [2, 3]}}}, "already"),
        (
            {"refit_cv_folds": 3, "template": "two_tower", "params": {}, "space": None},
            "no cv_folds",
        ),
    ]
    for extra, words in cases:
        with pytest.raises(ValidationError) as caught:
            _create(workspace, dataset, **extra)
        errors = caught.value.message_dict
        assert words in " ".join(errors.get("refit_cv_folds", [])), (extra, errors)
    assert not TuningJob.objects.for_workspace(workspace).exists()
    # 0 and 1 are off, as cv_folds' own 0 and 1 are.
    assert _create(workspace, dataset, name="off", refit_cv_folds=1).refit_cv_folds == 0


@pytest.mark.server_pass  # processes and workers: the database under them changes nothing
def test_the_best_trial_is_refit_with_cv_folds_and_that_model_registered(workspace, dataset):
    node = make_node()
    tj = _create(workspace, dataset, n_trials=2, refit_cv_folds=3)
    tuning.tuning_job_advance(tj.pk)
    _run_pending(tj, node)  # both trials, then the advance that starts the refit
    tj.refresh_from_db()
    refit = tj.refit_job
    assert tj.state == TuningState.RUNNING and refit is not None, tj.state_reason
    assert "refitting trial" in tj.state_reason
    best = tj.best_trial
    assert refit.params == {**best.job.params, "cv_folds": 3}
    assert refit.template == "logreg" and refit.dataset_id == dataset.pk
    assert refit.name == "tune-lr-refit" and refit.cpu_milli == tj.cpu_milli
    assert not ModelVersion.objects.for_workspace(workspace).exists()
    # A second (or restarted) controller starts no second refit.
    tuning.tuning_job_advance(tj.pk)
    assert _refit_job(tj).pk == refit.pk
    assert TrainingJob.objects.for_workspace(workspace).count() == 3
    # Its end wakes the tuning job, as a trial's does (``tuning_wake_for_job``).
    assert tuning.tuning_of_job(refit.pk) == tj.pk
    assert tuning.tuning_of_job(best.job_id) == tj.pk
    assert _run(refit, node) == JobState.SUCCEEDED
    assert tuning.tuning_job_advance(tj.pk) == TuningState.SUCCEEDED
    tj.refresh_from_db()
    version = ModelVersion.objects.for_workspace(workspace).get(pk=tj.model_version_id)
    assert version.job_id == refit.pk != best.job_id
    assert "refit with cv_folds=3" in version.description
    refit.refresh_from_db()
    assert refit.metrics["validation"]["rows"] > best.job.metrics["validation"]["rows"]
    assert "out-of-fold logloss" in tj.state_reason and tj.best_trial_id == best.pk
    verbs = list(Event.objects.for_workspace(workspace).values_list("verb", flat=True))
    assert verbs.count("training.tuning_job.refit_started") == 1
    assert verbs.count("training.tuning_job.succeeded") == 1


@pytest.mark.server_pass  # processes and workers: the database under them changes nothing
def test_a_refit_that_fails_fails_the_tuning_job_and_cancel_stops_a_running_one(workspace, dataset):
    node = make_node()
    tj = _create(workspace, dataset, n_trials=2, refit_cv_folds=2)
    tuning.tuning_job_advance(tj.pk)
    _run_pending(tj, node)
    refit = _refit_job(tj)
    job_transition(job=refit, to=JobState.FAILED, reason="out of memory")
    assert tuning.tuning_job_advance(tj.pk) == TuningState.FAILED
    tj.refresh_from_db()
    assert f"the refit job {refit.name} #{refit.pk} failed: out of memory" in tj.state_reason
    assert tj.model_version_id is None and tj.best_trial is not None
    assert not ModelVersion.objects.for_workspace(workspace).exists()

    other = _create(workspace, dataset, name="tune-two", n_trials=1, refit_cv_folds=2)
    tuning.tuning_job_advance(other.pk)
    _run_pending(other, node)
    running = _refit_job(other)
    assert running is not None and not running.is_terminal and len(_trials(other)) == 1
    tuning.tuning_job_cancel(actor=None, tuning_job=other)
    running.refresh_from_db()
    assert running.is_terminal or running.stop_requested
    assert TuningJob.objects.for_workspace(workspace).get(pk=other.pk).state == "cancelled"
