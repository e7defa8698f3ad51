"""The tuning controller (``training.tuning``) with real training children run by the node agent
in this process (no Celery worker: ``agent.execute_job`` is what a worker's ``run_job`` calls):
trials start within ``parallelism``, a restarted controller repeats nothing, the pruner cancels
a trial that is behind, the time budget stops the rest, the best trial by validation (and never
by the held-out rows) is registered."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from serving.models import ModelVersion
from training import agent, tuner, tuning
from training.models import (
    JobState,
    TrainingJob,
    TrialState,
    TuningJob,
    TuningState,
    TuningTrial,
)
from training.services import job_record_progress, job_transition
from training.tests.factories import make_demo_dataset, make_node, place
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import Event

pytestmark = pytest.mark.django_db(transaction=True)

BASE = {
    "epochs": 2,
    "batch_size": 256,
    "threads": 1,
    "importance": False,
    "log_every_steps": 5,
}
# logreg trials train by Adam epochs (per-epoch curves for the pruners); its default is the
# one-shot convex fit.
FIXED = {**BASE, "solver": "adam"}
LR = {"lr": {"low": 0.001, "high": 0.3, "log": True}}


@pytest.fixture
def dataset(workspace):
    return make_demo_dataset(workspace, scale=0.03)


def _create(workspace, dataset, **kw) -> TuningJob:
    args = {
        "actor": None,
        "workspace": workspace,
        "name": "tune-lr",
        "dataset": dataset,
        "template": "logreg",
        "params": FIXED,
        "space": LR,
        "n_trials": 4,
        "parallelism": 2,
        "pruner": "none",
        "cpu_milli": 500,
        "memory_mb": 512,
        "dispatch": False,
        **kw,
    }
    return tuning.tuning_job_create(**args)


def _trials(tj) -> list[TuningTrial]:
    return list(TuningTrial.objects.for_workspace(tj.workspace).filter(tuning_job=tj))


def _open_jobs(tj) -> list[TrainingJob]:
    return [t.job for t in TuningTrial.objects.for_workspace(tj.workspace).filter(
        tuning_job=tj).select_related("job") if not t.job.is_terminal]  # fmt: skip


def _run_pending(tj, node, *, before_advance=None) -> None:
    """Run every unfinished trial job to its end here, then advance the tuning job."""
    for job in _open_jobs(tj):
        if job.state == JobState.PENDING:
            place(job, node)
        assert agent.execute_job(job.pk) == JobState.SUCCEEDED
    if before_advance is not None:
        before_advance()
    tuning.tuning_job_advance(tj.pk)


def test_bad_input_names_the_field(workspace, dataset, other_workspace):
    cases = [
        ({"space": {"learning_rate": {"low": 0.1, "high": 0.2}}}, "space.learning_rate"),
        ({"space": {"lr": {"low": 0.1, "high": 50}}}, "space.lr"),
        ({"params": {**FIXED, "lr": 0.1}}, "params.lr"),
        ({"params": {"epochs": 0}}, "params.epochs"),
        ({"n_trials": 0}, "n_trials"),
        ({"parallelism": 99}, "parallelism"),
        ({"metric": "accuracy"}, "metric"),
        ({"pruner": "hyperband"}, "pruner"),
        ({"max_minutes": 0}, "max_minutes"),
        ({"template": "nope"}, "template"),
        ({"template": ""}, "template"),
        ({"cpu_milli": 0}, "cpu_milli"),
    ]
    for extra, field in cases:
        with pytest.raises(ValidationError) as caught:
            _create(workspace, dataset, **extra)
        assert field in caught.value.message_dict, (extra, caught.value.message_dict)
    theirs = make_demo_dataset(other_workspace, scale=0.01)
    with pytest.raises(ReferenceNotFound):
        _create(workspace, theirs)
    assert not TuningJob.objects.for_workspace(workspace).exists()


def test_a_trial_row_has_no_place_for_a_held_out_metric():
    """What the controller reads back into the tuner (``trial_record``) comes from these
    columns; none of them can hold a test-row metric."""
    columns = {f.name for f in TuningTrial._meta.get_fields()}
    assert not any("holdout" in c or "test" in c for c in columns), columns
    assert {"value", "intermediate"} <= columns


def test_parallelism_is_capped_by_the_workspace_quota(workspace, dataset):
    from training.scheduler.models import WorkspaceQuota

    WorkspaceQuota.objects.create(workspace=workspace, cpu_milli=1500, memory_mb=8192)
    assert tuning.parallelism_limit(workspace, {"cpu_milli": 500, "memory_mb": 512}) == 3
    with pytest.raises(ValidationError) as caught:
        _create(workspace, dataset, parallelism=4)
    assert "at most 3" in caught.value.message_dict["parallelism"][0]
    assert _create(workspace, dataset, parallelism=3).parallelism == 3


def test_the_default_space_and_a_base_jobs_config(workspace, dataset):
    from training.services import job_create

    base = job_create(
        actor=None, workspace=workspace, name="base", dataset=dataset, template="fine_ranking",
        params={**BASE, "lr": 0.05, "dropout": 0.1}, cpu_milli=700, memory_mb=600,
    )  # fmt: skip
    tj = tuning.tuning_job_create(
        actor=None, workspace=workspace, name="from-base", base_job=base, dispatch=False
    )
    assert tj.template == "fine_ranking" and tj.dataset_id == dataset.pk
    assert tj.space == tuning.default_space_json("fine_ranking")
    assert "lr" not in tj.params and "dropout" not in tj.params  # searched now
    assert tj.params["epochs"] == 2 and (tj.cpu_milli, tj.memory_mb) == (700, 600)
    assert tj.metric == "logloss" and tj.direction == "minimize"


@pytest.mark.server_pass  # processes and workers: the database under them changes nothing
def test_trials_run_within_parallelism_and_the_best_by_validation_is_registered(workspace, dataset):
    node = make_node()
    tj = _create(workspace, dataset)
    assert tuning.tuning_job_advance(tj.pk) == TuningState.RUNNING
    assert len(_trials(tj)) == 2 and len(_open_jobs(tj)) == 2
    # A second (or restarted) controller finds the slots taken: nothing new, nothing repeated.
    tuning.tuning_job_advance(tj.pk)
    tj.refresh_from_db()
    first = _trials(tj)
    assert len(first) == 2
    # The second trial's params are what the study rebuilt from the first one asks for.
    record = [tuning.trial_record(first[0])]
    assert first[1].params == tuner.ask(tuning.tuning_space(tj), record, seed=tj.seed)

    def poison():
        """The held-out rows say the opposite of validation: the worse a trial's validation
        log loss, the better its held-out numbers. The choice must not move."""
        for t in _trials(tj):
            job = t.job
            job.refresh_from_db()
            if job.state == JobState.SUCCEEDED:
                metrics = dict(job.metrics)
                v = metrics["validation"]["logloss"]
                metrics["holdout"] = {**metrics["holdout"], "logloss": 1 / v, "auc": v}
                TrainingJob.objects.unscoped().filter(pk=job.pk).update(metrics=metrics)

    while tj.state == TuningState.RUNNING:
        _run_pending(tj, node, before_advance=poison)
        tj.refresh_from_db()
        assert len(_open_jobs(tj)) <= 2
    trials = _trials(tj)
    assert tj.state == TuningState.SUCCEEDED, tj.state_reason
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert len({t.params["lr"] for t in trials}) == 4
    by_validation = {
        t.number: tuner.validation_value(
            TrainingJob.objects.unscoped().get(pk=t.job_id).metrics["validation"], "logloss"
        )
        for t in trials
    }
    best = min(by_validation, key=by_validation.get)
    assert tj.best_trial.number == best and tj.best_value == by_validation[best]
    # every trial's validation rows came back from its sandbox, to compare trials row by row
    assert set(tuning.trial_row_losses(trials)) == {0, 1, 2, 3}
    assert all(t.value == by_validation[t.number] for t in trials)
    assert all(len(t.intermediate) == 2 for t in trials)  # one validation point per epoch
    version = ModelVersion.objects.for_workspace(workspace).get(pk=tj.model_version_id)
    assert version.job_id == tj.best_trial.job_id
    assert version.model.name == "tune-lr" and tj.model_version_label == "tune-lr v1"
    verbs = list(Event.objects.for_workspace(workspace).values_list("verb", flat=True))
    assert verbs.count("training.tuning_trial.started") == 4
    assert verbs.count("training.tuning_trial.complete") == 4
    assert {"training.tuning_job.running", "training.tuning_job.succeeded"} <= set(verbs)
    # Done is done: another advance changes nothing.
    assert tuning.tuning_job_advance(tj.pk) == TuningState.SUCCEEDED
    assert len(_trials(tj)) == 4


def _epoch_points(job, values: list[float]) -> None:
    for epoch, value in enumerate(values, start=1):
        job_record_progress(job_id=job.pk, metrics=[(epoch * 10, "val_logloss", value)], step=10)


@pytest.mark.server_pass  # processes and workers: the database under them changes nothing
def test_the_median_pruner_cancels_a_trial_behind_the_finished_ones(workspace, dataset):
    node = make_node()
    tj = _create(workspace, dataset, n_trials=3, parallelism=2, pruner="median")
    tuning.tuning_job_advance(tj.pk)
    _run_pending(tj, node)  # trials 0 and 1 complete; trial 2 starts
    third = (
        TuningTrial.objects.for_workspace(workspace)
        .select_related("job")
        .get(tuning_job=tj, number=2)
    )
    job = third.job
    place(job, node)
    job_transition(job=job, to=JobState.RUNNING)  # its agent started it
    finished = sorted(t.value for t in _trials(tj) if t.state == TrialState.COMPLETE)
    _epoch_points(job, [finished[-1] * 3])
    tuning.tuning_job_advance(tj.pk)
    third.refresh_from_db()
    assert third.state == TrialState.RUNNING  # epoch 1 is the warm-up: never judged
    _epoch_points(job, [finished[-1] * 3])  # epoch 2, still far behind
    tuning.tuning_job_advance(tj.pk)
    third.refresh_from_db()
    job.refresh_from_db()
    assert third.state == TrialState.PRUNED and third.value == pytest.approx(finished[-1] * 3)
    assert job.stop_requested == "cancel"
    tj.refresh_from_db()
    assert tj.state == TuningState.RUNNING  # its job still holds the slot until it stops
    job_transition(job=job, to=JobState.CANCELLED, reason="cancel requested", stop_requested="")
    assert tuning.tuning_job_advance(tj.pk) == TuningState.SUCCEEDED
    tj.refresh_from_db()
    assert tj.best_trial.number in {0, 1}
    assert Event.objects.for_workspace(workspace).filter(verb="training.tuning_trial.pruned")


def test_the_time_budget_stops_open_trials_and_cancel_stops_everything(workspace, dataset):
    tj = _create(workspace, dataset, max_minutes=1)
    tuning.tuning_job_advance(tj.pk)
    TuningJob.objects.unscoped().filter(pk=tj.pk).update(
        started_at=timezone.now() - timezone.timedelta(minutes=2)
    )
    assert tuning.tuning_job_advance(tj.pk) == TuningState.FAILED
    assert {t.state for t in _trials(tj)} == {TrialState.CANCELLED}
    assert all(t.job.state == JobState.CANCELLED for t in _trials(tj))
    tj.refresh_from_db()
    assert tj.state_reason == "no trial completed" and len(_trials(tj)) == 2

    other = _create(workspace, dataset, name="cancel-me")
    tuning.tuning_job_advance(other.pk)
    tuning.tuning_job_cancel(actor=None, tuning_job=other)
    assert other.state == TuningState.CANCELLED
    assert all(t.job.state == JobState.CANCELLED for t in _trials(other))
    assert tuning.tuning_job_advance(other.pk) == TuningState.CANCELLED
    assert len(_trials(other)) == 2


@pytest.mark.django_db  # on-commit callbacks are captured only inside a test transaction
def test_a_trial_job_ending_or_reaching_an_epoch_wakes_its_tuning_job(
    workspace, dataset, django_capture_on_commit_callbacks
):
    from training.services import job_create

    def wakes(callbacks) -> int:
        return sum("_dispatch" in c.__qualname__ for c in callbacks)

    tj = _create(workspace, dataset)
    tuning.tuning_job_advance(tj.pk)
    job = _trials(tj)[0].job
    with django_capture_on_commit_callbacks() as callbacks:
        job_record_progress(job_id=job.pk, metrics=[(5, "loss", 0.5)], step=5)
    assert wakes(callbacks) == 0  # a training loss is no news for the tuner
    with django_capture_on_commit_callbacks() as callbacks:
        job_record_progress(job_id=job.pk, metrics=[(10, "val_logloss", 0.5)], step=10)
    assert wakes(callbacks) == 1
    with django_capture_on_commit_callbacks() as callbacks:
        job_transition(job=job, to=JobState.CANCELLED, reason="by hand")
    assert wakes(callbacks) == 1
    alone = job_create(actor=None, workspace=workspace, name="alone", dataset=dataset,
                       template="logreg")  # fmt: skip
    with django_capture_on_commit_callbacks() as callbacks:
        job_transition(job=alone, to=JobState.CANCELLED, reason="by hand")
    assert wakes(callbacks) == 0
    tuning.tuning_job_advance(tj.pk)
    states = {t.number: t.state for t in _trials(tj)}
    assert states[0] == TrialState.CANCELLED and len(states) == 3  # a new trial took the slot


@pytest.mark.server_pass  # processes and workers: the database under them changes nothing
def test_a_best_trial_that_cannot_be_registered_fails_the_tuning_job_saying_why(workspace, dataset):
    import shutil

    node = make_node()
    tj = _create(workspace, dataset, n_trials=2)
    tuning.tuning_job_advance(tj.pk)

    def lose_the_bundles():
        for trial in _trials(tj):
            job = TrainingJob.objects.unscoped().get(pk=trial.job_id)
            shutil.rmtree(agent.artifact_path(job.model_path))

    _run_pending(tj, node, before_advance=lose_the_bundles)
    tj.refresh_from_db()
    assert tj.state == TuningState.FAILED
    assert tj.state_reason.startswith("registering the best trial:"), tj.state_reason
    assert tj.best_trial is not None and tj.model_version_id is None
    assert not ModelVersion.objects.for_workspace(workspace).exists()


def test_the_validation_rows_a_trial_reports_cap_the_trials(workspace, dataset):
    tj = _create(workspace, dataset, n_trials=12)
    tuning.tuning_job_advance(tj.pk)
    assert tuning.trial_cap(tj, _trials(tj)) == 12  # no trial has reported yet
    first = _trials(tj)[0].job
    for rows, cap in [(8, tuner.MIN_TRIALS), (40, 10), (4000, 12)]:
        metrics = {"validation": {"rows": rows, "logloss": 0.6}}
        TrainingJob.objects.unscoped().filter(pk=first.pk).update(metrics=metrics)
        assert tuning.trial_cap(tj, _trials(tj)) == cap
