"""A job on the Kueue backend run by the agents of its TrainJob's pods (issue 21): each pod is stood
in for by a real Celery worker on a node queue with ``RANKOPS_TRAINJOB`` in its environment, as
the TrainJob's runtime starts the agent; the TrainJob goes to a loopback API server. Kueue's
preemption (the TrainJob suspended: its pod's agent gets SIGTERM, whose handler runs here) cordons
the pod's node, checkpoints the job and requeues it, and the job resumes on the pod of the next
admission and finishes once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection

from training import agent
from training.models import TRAINJOB_LABEL, JobState, Node, NodeState, TrainingJob
from training.scheduler.models import JobScheduling
from training.services import job_create, job_work_dir
from training.tasks import _checkpoint_running_jobs
from training.tests.factories import make_demo_dataset
from training.tests.workers import wait_for
from workspaces.models import Event
from workspaces.testing.kube_api import fake_api_server
from workspaces.testing.workers import embedded_worker

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="the tick and the agent write concurrently: PostgreSQL (SQLite locks tables)",
    ),
]

SLOW = {
    "epochs": 2,
    "batch_size": 32,
    "threads": 1,
    "log_every_steps": 2,
    "step_sleep_s": 0.05,
    "checkpoint_every_steps": 5,
    "early_stopping_patience": 0,
}


def _job(pk) -> TrainingJob:
    return TrainingJob.objects.unscoped().get(pk=pk)


@contextmanager
def pod(trainjob: str, monkeypatch) -> Iterator[str]:
    """A running pod of ``trainjob``: its agent, named after the pod; yields the node name."""
    name = f"{trainjob}-node-0-0-{uuid.uuid4().hex[:5]}"
    monkeypatch.setenv(agent.TRAINJOB_ENV, trainjob)  # read when the agent starts
    try:
        with embedded_worker([f"node.{name}"]):
            wait_for(lambda: Node.objects.filter(name=name).exists(), timeout=30, what=name)
            yield name
    finally:
        agent.HEARTBEATS.shutdown()
        agent.SHUTTING_DOWN.clear()


def test_kueue_preempts_the_trainjob_and_the_job_resumes_on_its_next_pods(
    workspace, tmp_path, settings, monkeypatch
):
    dataset = make_demo_dataset(workspace, scale=0.05)
    with fake_api_server() as cluster:
        settings.TRAINING_BACKEND = "kueue"
        settings.TRAINING_KUBECONFIG = str(cluster.write_kubeconfig(tmp_path / "kubeconfig"))
        settings.TRAINING_K8S_NAMESPACE = "rankops"
        job = job_create(
            actor=None, workspace=workspace, name="on-kueue", dataset=dataset,
            template="fine_ranking", params=SLOW, cpu_milli=1000, memory_mb=256,
        )  # fmt: skip
        trainjob = f"rankops-job-{job.pk}"
        submitted = JobScheduling.objects.unscoped().filter(job=job, trainjob=trainjob)
        wait_for(submitted.exists, timeout=30, what="the TrainJob", tick=True)
        with pod(trainjob, monkeypatch) as first:  # Kueue admitted it: its pod starts
            wait_for(
                lambda: _job(job.pk).checkpoint_step >= 6 and _job(job.pk).state == "running",
                timeout=120,
                what="a checkpoint on the first pod",
                tick=True,
            )
            assert _job(job.pk).node.name == first
            # Kueue suspends the TrainJob: the pod's agent gets SIGTERM (its handler, as Celery
            # runs it on worker_shutting_down), and the pod goes once its job has stopped.
            _checkpoint_running_jobs()
            wait_for(lambda: _job(job.pk).state != JobState.RUNNING, timeout=60, what="the stop")
        stopped = _job(job.pk)
        assert stopped.state in (JobState.PREEMPTED, JobState.PENDING, JobState.ADMITTED)
        assert Node.objects.get(name=first).state == NodeState.CORDONED
        with pod(trainjob, monkeypatch) as second:  # Kueue admits it again: a new pod
            wait_for(lambda: _job(job.pk).is_terminal, timeout=180, what="the job", tick=True)
        wait_for(lambda: trainjob not in str(cluster.objects), timeout=30, what="delete", tick=True)
    job = _job(job.pk)
    text = (job_work_dir(job) / agent.LOG_FILE).read_text()
    assert job.state == JobState.SUCCEEDED, (job.state_reason, text[-3000:])
    assert job.node.name == second and job.node.labels == {TRAINJOB_LABEL: trainjob}
    assert job.attempts == 2 and job.step == job.total_steps
    resumed_at = int(text.split("resumed from checkpoint at step ")[1].split()[0])
    assert resumed_at >= stopped.checkpoint_step > 0
    verbs = list(
        Event.objects.for_workspace(workspace)
        .filter(refs__kind="training_job", refs__object_id=str(job.pk))
        .filter(verb__in=["training.job.preempted", "training.job.succeeded"])
        .values_list("verb", flat=True)
    )
    assert sorted(verbs) == ["training.job.preempted", "training.job.succeeded"]
    assert JobScheduling.objects.unscoped().get(job=job).trainjob == ""
