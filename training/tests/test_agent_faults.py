"""A tenant's failing job never takes a shared node away, and a killed agent loses no job
(issue 14), with real Celery workers and real training children."""

from __future__ import annotations

import signal
import subprocess
import uuid

import pytest
from django.db import connection

from training import agent
from training.models import JobMetric, JobState, Node, NodeState, TrainingJob
from training.scheduler.failover import reconcile
from training.services import entry_point_register, job_create, job_work_dir
from training.tasks import run_job
from training.tests.factories import FAST, make_demo_dataset, place
from training.tests.workers import node_worker, start_worker_process, wait_for

pytestmark = [pytest.mark.celery_worker, pytest.mark.django_db(transaction=True)]

FAILING = b"raise RuntimeError('this model is broken on purpose')\n"


def _job(pk) -> TrainingJob:
    return TrainingJob.objects.unscoped().get(pk=pk)


@pytest.mark.server_pass  # processes and workers: the database under them changes nothing
def test_a_job_failing_five_times_leaves_the_node_ready_for_other_workspaces(
    workspace, other_workspace
):
    dataset = make_demo_dataset(workspace, scale=0.02)
    entry_point_register(actor=None, workspace=workspace, name="broken", script=FAILING)
    broken = job_create(
        actor=None, workspace=workspace, name="broken", dataset=dataset, entry_point="broken",
        params=FAST, cpu_milli=1000, memory_mb=256, max_attempts=5,
    )  # fmt: skip
    with node_worker("f") as node:
        wait_for(lambda: _job(broken.pk).is_terminal, timeout=240, what="five attempts", tick=True)
        broken = _job(broken.pk)
        assert broken.state == JobState.FAILED and broken.attempts == 5
        assert "broken on purpose" in broken.state_reason
        reconcile()
        node.refresh_from_db()
        assert node.state == NodeState.READY, node.state_reason
        assert node.failure_count == 0
        theirs = job_create(
            actor=None, workspace=other_workspace,
            name="theirs", dataset=make_demo_dataset(other_workspace, scale=0.02),
            template="logreg", params=FAST, cpu_milli=1000, memory_mb=256,
        )  # fmt: skip
        wait_for(lambda: _job(theirs.pk).is_terminal, timeout=120, what="their job", tick=True)
    theirs = _job(theirs.pk)
    assert theirs.state == JobState.SUCCEEDED, theirs.state_reason
    assert theirs.node_id == node.pk


@pytest.mark.server_pass  # processes and workers: the database under them changes nothing
def test_a_job_past_its_workspace_wall_time_is_stopped_and_fails(workspace):
    from workspaces.services import workspace_policy_set

    workspace_policy_set(actor=None, workspace=workspace, max_job_wall_s=2)
    dataset = make_demo_dataset(workspace, scale=0.05)
    # Adam epochs (logreg's default convex fit would end in one solve, inside the limit)
    slow = {**FAST, "solver": "adam", "epochs": 50, "batch_size": 32, "step_sleep_s": 0.05}
    job = job_create(
        actor=None, workspace=workspace, name="endless", dataset=dataset, template="logreg",
        params=slow, cpu_milli=1000, memory_mb=256,
    )  # fmt: skip
    with node_worker("w") as node:
        place(job, node)
        run_job.apply_async(args=[job.pk], queue=node.queue)
        wait_for(lambda: _job(job.pk).is_terminal, timeout=120, what="the stopped job")
    job = _job(job.pk)
    assert (
        job.state == JobState.FAILED and job.attempts == 1
    )  # not retried: it would run over again
    assert "wall-time limit of 2 s" in job.state_reason
    assert job.step < job.total_steps
    assert Node.objects.get(pk=node.pk).failure_count == 0


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="a second worker process shares the test database only on a server (DATABASE_URL)",
)
def test_a_killed_and_restarted_worker_resumes_its_running_job_from_the_checkpoint(
    workspace, tmp_path
):
    dataset = make_demo_dataset(workspace, scale=0.05)
    # Adam epochs with checkpoints (logreg's default convex fit is one solve)
    slow = {**FAST, "solver": "adam", "epochs": 4, "batch_size": 32, "step_sleep_s": 0.05}
    slow["checkpoint_every_steps"] = 5
    job = job_create(
        actor=None, workspace=workspace, name="survivor", dataset=dataset, template="logreg",
        params=slow, cpu_milli=1000, memory_mb=256,
    )  # fmt: skip
    name = f"k{uuid.uuid4().hex[:10]}"
    queue = f"node.{name}"
    log = tmp_path / "worker.log"
    first = start_worker_process(queue, log)
    second = None
    try:
        node = wait_for(lambda: Node.objects.filter(name=name).first(), timeout=60, what="node")
        place(job, node)
        run_job.apply_async(args=[job.pk], queue=queue)
        wait_for(
            lambda: _job(job.pk).state == JobState.RUNNING and _job(job.pk).checkpoint_step >= 10,
            timeout=120,
            what="a checkpoint",
        )
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        checkpointed = _job(job.pk).checkpoint_step
        second = start_worker_process(queue, log)  # restarted at once, well within 5 s
        work = job_work_dir(job)
        wait_for(
            lambda: "resumed from checkpoint at step" in (work / agent.LOG_FILE).read_text(),
            timeout=90,  # a worker's start (Django, torch) takes tens of seconds on a busy box
            what="the resumed attempt",
        )
        wait_for(lambda: _job(job.pk).is_terminal, timeout=120, what="the job to finish")
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
    job = _job(job.pk)
    assert job.state == JobState.SUCCEEDED, (job.state_reason, log.read_text()[-3000:])
    assert job.attempts == 2 and job.step == job.total_steps
    text = (job_work_dir(job) / agent.LOG_FILE).read_text()
    resumed_at = int(text.split("resumed from checkpoint at step ")[1].split()[0])
    assert resumed_at >= checkpointed > 0
    steps = list(
        JobMetric.objects.for_workspace(workspace)
        .filter(job=job, name="loss")
        .order_by("id")
        .values_list("step", flat=True)
    )
    assert max(steps) == job.total_steps
    assert any(s > resumed_at for s in steps)
