"""Reconciler (lost nodes, cordons, bounded retries) and tidal lending."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from training.models import JobState, Node, NodeKind, NodeState, PriorityClass, TrainingJob
from training.scheduler.failover import reconcile
from training.scheduler.lending import in_window, reclaim_node, utilisation
from training.scheduler.models import LendingLease
from training.scheduler.tests.factories import make_job, make_node, run_on
from training.scheduler.tick import schedule_tick
from training.services import job_transition

pytestmark = pytest.mark.django_db


def reload(obj):
    return (
        type(obj).objects.unscoped().get(pk=obj.pk)
        if hasattr(type(obj).objects, "unscoped")
        else type(obj).objects.get(pk=obj.pk)
    )


def test_lost_node_is_isolated_and_its_job_resumes_elsewhere(workspace):
    dying = make_node(gpus=1, name="dying")
    healthy = make_node(gpus=1, name="healthy")
    job = run_on(make_job(workspace, gpu_count=1), dying, [(0, 1000)])
    TrainingJob.objects.unscoped().filter(pk=job.pk).update(checkpoint_step=25, attempts=1)
    Node.objects.filter(pk=dying.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    summary = reconcile()
    assert summary["lost"] == 1 and summary["requeued"] == 1
    assert reload(dying).state == NodeState.LOST
    job = reload(job)
    assert job.state == JobState.PENDING
    assert "resumes from step 25" in job.state_reason
    schedule_tick()
    job = reload(job)
    assert job.state == JobState.PLACED and job.node == healthy
    assert job.checkpoint_step == 25


def test_retries_are_bounded(workspace):
    node = make_node(gpus=1)
    job = run_on(make_job(workspace, gpu_count=1, max_attempts=2), node, [(0, 1000)])
    TrainingJob.objects.unscoped().filter(pk=job.pk).update(attempts=2)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    summary = reconcile()
    job = reload(job)
    assert summary["failed"] == 1
    assert job.state == JobState.FAILED
    assert "gave up after 2 attempts" in job.state_reason


def test_node_with_repeated_node_faults_is_cordoned(workspace):
    bad = make_node(gpus=1, name="flaky", failure_count=3)  # the agent counts node faults only
    summary = reconcile()
    assert summary["cordoned"] == 1
    assert reload(bad).state == NodeState.CORDONED
    waiting = make_job(workspace, gpu_count=1)
    schedule_tick()
    assert reload(waiting).state == JobState.ADMITTED  # no new work on a cordoned node


def test_jobs_failing_on_their_own_never_cordon_the_node(workspace, other_workspace):
    node = make_node(gpus=1, name="shared")
    for _ in range(5):
        job = run_on(make_job(workspace, gpu_count=1), node, [(0, 1000)])
        job_transition(job=job, to=JobState.FAILED, reason="training child exited with 1")
    assert reconcile()["cordoned"] == 0
    assert reload(node).state == NodeState.READY
    theirs = make_job(other_workspace, gpu_count=1)
    schedule_tick()
    assert reload(theirs).state == JobState.PLACED and reload(theirs).node == node


def test_lending_windows():
    nights = [{"days": [0, 1, 2, 3, 4], "start": "22:00", "end": "06:00"}]
    monday_23 = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)  # a Monday
    assert in_window(nights, monday_23)
    assert in_window(nights, monday_23 + timedelta(hours=6))  # Tuesday 05:00
    assert not in_window(nights, monday_23 + timedelta(hours=8))  # Tuesday 07:00
    assert not in_window(nights, datetime(2026, 12, 6, 2, 0, tzinfo=UTC))  # Sunday 02:00
    weekends = [{"days": [5, 6], "start": "00:00", "end": "24:00"}]
    assert in_window(weekends, datetime(2026, 12, 6, 12, 0, tzinfo=UTC))


def test_reclaim_preempts_borrowed_jobs_and_stops_lending(workspace):
    always = [{"days": list(range(7)), "start": "00:00", "end": "24:00"}]
    node = make_node(gpus=1, kind=NodeKind.INFERENCE, lending_windows=always)
    job = make_job(workspace, gpu_count=1, priority_class=PriorityClass.EXPLORATION)
    schedule_tick()
    job = reload(job)
    assert job.state == JobState.PLACED and job.node == node
    job_transition(job=job, to=JobState.RUNNING)
    assert reclaim_node(node=node, reason="serving load rising") == 1
    job = reload(job)
    assert job.stop_requested == "preempt"
    lease = LendingLease.objects.unscoped().get(job=job)
    assert lease.ended_at is not None and "serving load" in lease.end_reason
    job_transition(job=job, to=JobState.PREEMPTED, reason="checkpointed")
    summary = schedule_tick()
    assert summary["requeued"] == 1
    assert reload(job).state == JobState.ADMITTED  # not lent again while reclaimed
    usage = utilisation(days=1)
    assert usage["inference_nodes"] == 1
    assert usage["gpu_utilisation_with_lending"] >= usage["gpu_utilisation_without_lending"]


def test_window_end_reclaims(workspace):
    now = timezone.now()
    start = (now - timedelta(hours=1)).strftime("%H:%M")
    end = (now + timedelta(hours=1)).strftime("%H:%M")
    node = make_node(
        gpus=1,
        kind=NodeKind.INFERENCE,
        lending_windows=[{"days": list(range(7)), "start": start, "end": end}],
    )
    job = make_job(workspace, gpu_count=1, priority_class=PriorityClass.EXPLORATION)
    schedule_tick()
    job_transition(job=reload(job), to=JobState.RUNNING)
    assert reconcile(now=now)["reclaimed"] == 0
    later = now + timedelta(hours=2)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=later)
    assert reconcile(now=later)["reclaimed"] == 1
    assert reload(job).stop_requested == "preempt"


def test_an_uncordoned_node_needs_new_failures_to_be_cordoned_again(workspace):
    node = make_node(gpus=1, failure_count=3)
    assert reconcile()["cordoned"] == 1
    Node.objects.filter(pk=node.pk).update(state=NodeState.READY, state_reason="fixed")
    assert reconcile()["cordoned"] == 0
    Node.objects.filter(pk=node.pk).update(failure_count=6)
    assert reconcile()["cordoned"] == 1
