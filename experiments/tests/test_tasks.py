"""The beat task on a real Celery worker: a running experiment with a guardrail breach is
stopped and its traffic cleared; the schedule names the task."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings

from config.celery import app
from experiments import services, tasks
from experiments.models import Experiment
from experiments.tests.factories import click_events, make_deployment, served_in_experiment
from serving.routing import routing_table
from workspaces.models import Role
from workspaces.testing.waiting import wait_until
from workspaces.testing.workers import embedded_worker


def test_beat_schedules_the_check():
    entry = settings.CELERY_BEAT_SCHEDULE["experiments-check-running"]
    assert entry["task"] == tasks.check_running.name and entry["task"] in app.tasks
    assert entry["schedule"] <= 60


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
def test_check_running_on_a_real_worker_stops_a_breaching_experiment(workspace, members):
    dev = members[Role.DEVELOPER]
    dep, (treatment,) = make_deployment(workspace)
    exp = services.experiment_create(
        actor=dev,
        workspace=workspace,
        key="beat-ab",
        hypothesis="worse on purpose",
        deployment=dep.name,
        treatment_versions=[treatment.pk],
        guardrails=[{"metric": "ctr", "max_drop": 0.05}],
        ramp_plan=[20],
        min_units=50,
    )
    exp = services.experiment_submit(actor=dev, experiment=exp)
    served = served_in_experiment(workspace, dep, units=3000)
    events = click_events(
        served, click_rate={"control": 0.2, "treatment": 0.08}, seed=4, event_ids=True
    )
    services.feedback_record(actor=None, workspace=workspace, events=events)
    queue = f"test-{uuid.uuid4().hex[:12]}"
    with embedded_worker([queue]):
        tasks.check_running.apply_async(queue=queue)
        wait_until(
            lambda: Experiment.objects.for_workspace(workspace).get(pk=exp.pk).state == "stopped",
            timeout=30,
            what="the worker to stop the experiment",
            interval=0.2,
        )
    exp.refresh_from_db()
    assert exp.state == "stopped"
    assert routing_table(workspace, dep.name)["layers"] == []
    assert exp.snapshots.count() == 1
