"""The node agent runs jobs as child processes: progress, stop (preempt/cancel), SIGKILL and
resume from the checkpoint, incremental training, usage and cost resources."""

from __future__ import annotations

import os
import signal

import pytest

from training import agent, evaluation, runner
from training.models import JobMetric, JobState, TrainingJob
from training.services import job_create, job_request_stop, job_transition, job_work_dir
from training.tests.factories import FAST, make_demo_dataset, make_node, place
from training.tests.workers import execute_in_thread
from workspaces.models import Event
from workspaces.testing.waiting import wait_until


def _wait(predicate, timeout=60.0, what="condition"):
    return wait_until(predicate, timeout=timeout, what=what)


def _job(workspace, dataset, **params):
    return job_create(
        actor=None,
        workspace=workspace,
        name="ctr",
        dataset=dataset,
        template=params.pop("template", "fine_ranking"),
        params={**FAST, **params},
    )


def _reference_auc(job, tmp_path) -> float:
    """The same job, uninterrupted, trained in-process with the same seed."""
    spec = agent.build_job_spec(job)
    spec.work_dir = str(tmp_path / "reference")
    spec.params = {**spec.params, "step_sleep_s": 0}
    events = []
    assert runner.train(spec, emit=runner.Emitter(sink=events.append)) == 0
    done = next(e for e in events if e["type"] == "done")
    return done["metrics"]["holdout"]["auc"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_sigkilled_child_is_requeued_and_resumes_to_the_same_model(workspace, tmp_path):
    dataset = make_demo_dataset(workspace, scale=0.1)
    node = make_node()
    job = _job(
        workspace, dataset, epochs=4, batch_size=64, checkpoint_every_steps=5, step_sleep_s=0.05
    )
    reference = _reference_auc(job, tmp_path)
    place(job, node)
    thread, result = execute_in_thread(job.pk)
    pid_file = job_work_dir(job) / agent.PID_FILE
    _wait(
        lambda: TrainingJob.objects.unscoped().get(pk=job.pk).checkpoint_step >= 10,
        what="a checkpoint",
    )
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    thread.join(60)
    assert result["state"] == JobState.PENDING
    job.refresh_from_db()
    verbs = list(
        Event.objects.for_workspace(workspace).order_by("id").values_list("verb", "payload__reason")
    )
    assert job.attempts == 1 and job.node is None, (job.attempts, job.state_reason, verbs)
    killed_at = job.checkpoint_step
    assert 10 <= killed_at < job.total_steps

    place(job, node)
    # The reference run's bundle plays the workspace's production model (serving's resolver).
    production = str(tmp_path / "reference" / "model")
    resolver = lambda ws, deployment="": production if ws.pk == workspace.pk else None  # noqa: E731
    evaluation.register_production_model_resolver(resolver)
    try:
        assert agent.execute_job(job.pk) == JobState.SUCCEEDED
    finally:
        evaluation._PRODUCTION_RESOLVERS.remove(resolver)
    job.refresh_from_db()
    log = (job_work_dir(job) / agent.LOG_FILE).read_text()
    assert f"resumed from checkpoint at step {killed_at}" in log
    assert job.metrics["production"]["auc"] == pytest.approx(reference, abs=1e-6)
    assert abs(job.metrics["auc_delta_vs_production"]) <= 0.002
    assert job.attempts == 2 and job.step == job.total_steps
    assert abs(job.metrics["holdout"]["auc"] - reference) <= 0.002
    assert job.model_path and (agent.artifact_path(job.model_path) / "spec.json").exists()
    assert JobMetric.objects.for_workspace(workspace).filter(job=job, name="loss").exists()
    assert job.usage["memory_peak_mb"] > 0 and job.usage["cpu_hours"] > 0
    finished = (
        Event.objects.for_workspace(workspace).filter(verb="training.job.succeeded").latest("id")
    )
    # The job's usage is what its two attempts' events recorded (the killed one's requeue and
    # the success), so the cost roll-ups priced from the events agree with it; a CPU node: no GPU.
    spent = [
        event.resources
        for event in Event.objects.for_workspace(workspace).filter(verb__startswith="training.job.")
        if event.resources
    ]
    assert len(spent) == 2, spent
    for key in ("cpu_hours", "gpu_hours", "memory_gb_hours"):
        assert job.usage[key] == pytest.approx(sum(r[key] for r in spent), abs=1e-5), key
    assert finished.resources["gpu_hours"] == 0
    assert 0 < finished.resources["cpu_hours"] < job.usage["cpu_hours"]
    assert job.metrics["importance"] and "roc" in job.metrics and "calibration" in job.metrics


@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_preempt_checkpoints_and_a_requeued_job_continues(workspace):
    dataset = make_demo_dataset(workspace, scale=0.05)
    node = make_node()
    job = _job(workspace, dataset, epochs=4, batch_size=32, step_sleep_s=0.03)
    place(job, node)
    thread, result = execute_in_thread(job.pk)
    _wait(lambda: TrainingJob.objects.unscoped().get(pk=job.pk).step >= 4, what="progress")
    job_request_stop(job=job, mode="preempt", reason="a production job needs the node")
    thread.join(60)
    assert result["state"] == JobState.PREEMPTED
    job.refresh_from_db()
    assert job.stop_requested == "" and 4 <= job.checkpoint_step < job.total_steps
    stopped_at = job.checkpoint_step
    preempted = (
        Event.objects.for_workspace(workspace).filter(verb="training.job.preempted").latest("id")
    )
    assert preempted.resources["cpu_hours"] > 0

    job_transition(job=job, to=JobState.PENDING, reason="requeued")
    place(job, node)
    assert agent.execute_job(job.pk) == JobState.SUCCEEDED
    log = (job_work_dir(job) / agent.LOG_FILE).read_text()
    assert f"resumed from checkpoint at step {stopped_at}" in log


@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_cancel_stops_a_running_job(workspace):
    dataset = make_demo_dataset(workspace, scale=0.05)
    job = _job(workspace, dataset, epochs=20, batch_size=32, step_sleep_s=0.03)
    place(job, make_node())
    thread, result = execute_in_thread(job.pk)
    _wait(lambda: TrainingJob.objects.unscoped().get(pk=job.pk).step >= 2, what="progress")
    job_request_stop(job=job, mode="cancel", reason="not needed")
    thread.join(60)
    assert result["state"] == JobState.CANCELLED


@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_agent_shutdown_checkpoints_and_releases_the_job(workspace):
    dataset = make_demo_dataset(workspace, scale=0.05)
    job = _job(workspace, dataset, epochs=20, batch_size=32, step_sleep_s=0.03)
    place(job, make_node())
    thread, result = execute_in_thread(job.pk)
    try:
        _wait(lambda: TrainingJob.objects.unscoped().get(pk=job.pk).step >= 2, what="progress")
        agent.SHUTTING_DOWN.set()  # what the worker's SIGTERM (worker_shutting_down) does
        thread.join(60)
    finally:
        agent.SHUTTING_DOWN.clear()
    assert result["state"] == JobState.PREEMPTED
    job.refresh_from_db()
    assert job.checkpoint_step >= 2 and "shutting down" in job.state_reason
