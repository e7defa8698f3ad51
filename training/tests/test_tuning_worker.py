"""Acceptance (issue 16): a tuning job of 8 trials, 2 at a time, runs through the scheduler on
real node agents (two embedded Celery workers, each a node) and registers its best trial.

The loop below is what the platform's beat and wake-ups do (``wait_for(tick=True)`` runs the
reconciler and a scheduler tick; the predicate advances the tuning job as its Celery task
would): trial jobs are created by the controller, admitted and placed by the scheduler, run by
the agents, and the controller reads what they did."""

from __future__ import annotations

import pytest

from serving.models import ModelVersion
from training import tuning
from training.models import JobState, TrialState, TuningState, TuningTrial
from training.tests.factories import make_demo_dataset
from training.tests.workers import node_worker, wait_for
from workspaces.models import Event

pytestmark = [pytest.mark.celery_worker, pytest.mark.django_db(transaction=True)]

# Adam epochs: the median pruner reads per-epoch curves (logreg's default is the convex fit).
FIXED = {
    "solver": "adam",
    "epochs": 2,
    "batch_size": 256,
    "threads": 1,
    "importance": False,
    "log_every_steps": 5,
}


def _most_at_once(intervals: list[tuple]) -> int:
    """The largest number of [start, end] intervals that overlap at one instant."""
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = current = 0
    for _, delta in points:  # at a tie an end (-1) sorts before a start: touching is not overlap
        current += delta
        most = max(most, current)
    return most


@pytest.mark.server_pass  # processes and workers: the database under them changes nothing
def test_eight_trials_two_at_a_time_on_real_workers_register_the_best(workspace):
    dataset = make_demo_dataset(workspace, scale=0.02)
    with node_worker("ta") as first, node_worker("tb") as second:
        whole_node = min(first.cpu_milli, second.cpu_milli)  # one trial per node at a time
        tj = tuning.tuning_job_create(
            actor=None,
            workspace=workspace,
            name="accept-tune",
            dataset=dataset,
            template="logreg",
            params=FIXED,
            space={"lr": {"low": 0.001, "high": 0.3, "log": True}},
            n_trials=8,
            parallelism=2,
            pruner="median",
            cpu_milli=whole_node,
            memory_mb=512,
            dispatch=False,
        )

        def finished():
            return tuning.tuning_job_advance(tj.pk) in {
                TuningState.SUCCEEDED,
                TuningState.FAILED,
                TuningState.CANCELLED,
            }

        wait_for(finished, timeout=900, what="the tuning job", tick=True)
    tj.refresh_from_db()
    trials = list(
        TuningTrial.objects.for_workspace(workspace).filter(tuning_job=tj).select_related("job")
    )
    seen = [(t.number, t.state, t.job.state, t.job.node_id, t.job.state_reason) for t in trials]
    assert tj.state == TuningState.SUCCEEDED, (tj.state_reason, seen)
    assert [t.number for t in trials] == list(range(8))
    assert all(t.job.is_terminal for t in trials)
    assert {t.state for t in trials} <= {TrialState.COMPLETE, TrialState.PRUNED}, seen
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) >= 2
    # Through the scheduler, on both workers' nodes.
    assert {t.job.node_id for t in trials} == {first.pk, second.pk}, seen
    assert all(t.job.attempts >= 1 for t in trials if t.job.state == JobState.SUCCEEDED)
    # Never more than 2 trials at once: neither unfinished (created -> ended) nor running.
    assert _most_at_once([(t.job.created_at, t.job.finished_at) for t in trials]) <= 2
    started = [t for t in trials if t.job.started_at is not None]
    assert _most_at_once([(t.job.started_at, t.job.finished_at) for t in started]) <= 2
    # The best by validation, registered: the version's source job is the best trial's.
    best = min(complete, key=lambda t: (t.value, t.number))
    assert tj.best_trial_id == best.pk and tj.best_value == best.value
    # The objective: the cross-fitted validation log loss (no test-row metric).
    assert best.value == best.job.metrics["validation"]["crossfit_logloss"]
    version = ModelVersion.objects.for_workspace(workspace).get(pk=tj.model_version_id)
    assert version.job_id == best.job_id
    assert (
        Event.objects.for_workspace(workspace)
        .filter(verb="serving.model_version.registered")
        .exists()
    )
