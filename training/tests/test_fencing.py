"""Fencing (issue 17): a node agent's writes carry its attempt number, and an attempt the job has
moved past can neither write progress nor end the job.

The service-level checks run on both backends. The acceptance case runs real processes: an agent
frozen with SIGSTOP past its heartbeat timeout, its node declared lost, the job started again on
another node, then the frozen agent woken with SIGCONT; it must stop its child and write nothing.
"""

from __future__ import annotations

import signal
import subprocess
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from training import agent
from training.models import JobMetric, JobState, Node, NodeState, TrainingJob
from training.scheduler.failover import NODE_LOST_AFTER, reconcile, requeue_job
from training.services import (
    StaleAttempt,
    job_create,
    job_record_progress,
    job_transition,
    job_work_dir,
)
from training.tasks import run_job
from training.tests.factories import FAST, make_demo_dataset, place
from training.tests.workers import node_worker, start_worker_process, wait_for
from workspaces.models import Event


def _job(pk) -> TrainingJob:
    return TrainingJob.objects.unscoped().get(pk=pk)


def _node(name: str) -> Node:
    return Node.objects.create(name=name, queue=f"node.{name}", state=NodeState.READY)


def _start(job: TrainingJob, node: Node) -> TrainingJob:
    """What an agent does when it starts the job: placed -> running as the next attempt."""
    place(job, node)
    return job_transition(
        job=job, to=JobState.RUNNING, expect=JobState.PLACED, attempts=job.attempts + 1
    )


@pytest.mark.django_db
def test_a_superseded_attempt_can_neither_record_progress_nor_finish_the_job(workspace):
    dataset = make_demo_dataset(workspace, scale=0.02)
    job = job_create(
        actor=None, workspace=workspace, name="fenced", dataset=dataset, template="logreg",
        params=FAST, cpu_milli=1000, memory_mb=256,
    )  # fmt: skip
    first, second = _node("fence-a"), _node("fence-b")
    job = _start(job, first)
    job_record_progress(job_id=job.pk, metrics=[(1, "loss", 0.7)], attempt=1, step=1)
    assert _job(job.pk).step == 1

    # The first node is declared lost; the job starts again elsewhere as attempt 2.
    requeue_job(job, "node fence-a lost")
    with pytest.raises(StaleAttempt, match="superseded"):  # requeued: not running at all
        job_record_progress(job_id=job.pk, metrics=[(2, "loss", 0.6)], attempt=1, step=2)
    job = _start(_job(job.pk), second)
    assert job.attempts == 2

    with pytest.raises(StaleAttempt, match=r"attempt 1 of job \d+ was superseded"):
        job_record_progress(job_id=job.pk, metrics=[(9, "loss", 0.1)], attempt=1, step=9)
    with pytest.raises(StaleAttempt):
        job_transition(job=_job(job.pk), to=JobState.SUCCEEDED, expect=JobState.RUNNING, attempt=1)
    job = _job(job.pk)
    assert (job.state, job.step, job.node_id) == (JobState.RUNNING, 1, second.pk)
    steps = JobMetric.objects.for_workspace(workspace).filter(job=job).values_list("step")
    assert list(steps) == [(1,)]

    # The running attempt writes as before.
    job_record_progress(job_id=job.pk, metrics=[(3, "loss", 0.5)], attempt=2, step=3)
    job_transition(job=job, to=JobState.SUCCEEDED, expect=JobState.RUNNING, attempt=2)
    assert _job(job.pk).state == JobState.SUCCEEDED
    with pytest.raises(StaleAttempt):  # finished: no attempt writes any more
        job_record_progress(job_id=job.pk, metrics=[], attempt=2, step=4)


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="a second worker process shares the test database only on a server (DATABASE_URL)",
)
def test_an_agent_woken_after_its_job_moved_stops_and_writes_nothing(workspace, tmp_path):
    dataset = make_demo_dataset(workspace, scale=0.05)
    # Adam epochs with checkpoints (logreg's default convex fit is one solve)
    slow = {**FAST, "solver": "adam", "epochs": 6, "batch_size": 32, "step_sleep_s": 0.03}
    slow["checkpoint_every_steps"] = 5
    job = job_create(
        actor=None, workspace=workspace, name="moved", dataset=dataset, template="logreg",
        params=slow, cpu_milli=1000, memory_mb=256,
    )  # fmt: skip
    name = f"s{uuid.uuid4().hex[:10]}"
    log = tmp_path / "frozen-worker.log"
    frozen = start_worker_process(f"node.{name}", log)
    stopped = False
    try:
        node_a = wait_for(lambda: Node.objects.filter(name=name).first(), timeout=60, what="node")
        place(job, node_a)
        run_job.apply_async(args=[job.pk], queue=node_a.queue)
        wait_for(
            lambda: _job(job.pk).state == JobState.RUNNING and _job(job.pk).checkpoint_step >= 5,
            timeout=120,
            what="the first attempt's checkpoint",
        )
        frozen.send_signal(signal.SIGSTOP)
        stopped = True
        # Past its heartbeat timeout (the heartbeat is moved back rather than waited for).
        Node.objects.filter(pk=node_a.pk).update(
            last_heartbeat=timezone.now() - NODE_LOST_AFTER - timedelta(seconds=5)
        )
        reconcile()
        assert Node.objects.get(pk=node_a.pk).state == NodeState.LOST
        assert _job(job.pk).state == JobState.PENDING
        with node_worker("b") as node_b:
            wait_for(
                lambda: _job(job.pk).attempts == 2 and _job(job.pk).state == JobState.RUNNING,
                timeout=120,
                what="the second attempt on the other node",
                tick=True,
            )
            assert _job(job.pk).node_id == node_b.pk
            frozen.send_signal(signal.SIGCONT)
            stopped = False
            work = job_work_dir(job)
            wait_for(
                lambda: "attempt 1 was superseded" in (work / agent.LOG_FILE).read_text(),
                timeout=60,
                what="the woken agent to see the fence",
            )
            wait_for(lambda: _job(job.pk).is_terminal, timeout=180, what="the job to finish")
    finally:
        if stopped:
            frozen.send_signal(signal.SIGCONT)
        frozen.send_signal(signal.SIGTERM)
        try:
            frozen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            frozen.kill()
    job = _job(job.pk)
    assert job.state == JobState.SUCCEEDED, (job.state_reason, log.read_text()[-3000:])
    assert job.attempts == 2 and job.node_id == node_b.pk
    assert job.step == job.total_steps
    ends = Event.objects.for_workspace(workspace).filter(
        verb__in=["training.job.succeeded", "training.job.failed", "training.job.pending"],
        refs__kind="training_job",
        refs__object_id=str(job.pk),
    )
    # One requeue (the lost node) and one success; nothing from the woken attempt.
    assert sorted(ends.values_list("verb", flat=True)) == [
        "training.job.pending",
        "training.job.succeeded",
    ]
    text = (job_work_dir(job) / agent.LOG_FILE).read_text()
    assert "stopped its child and wrote nothing more" in text
