"""A job on the Kueue backend run by the agents of its TrainJob's pods (issue 21): the pods are
stood in for by ``manage.py node_agent`` processes started as the TrainJob's runtime starts them
(``RANKOPS_TRAINJOB`` in their environment); the TrainJob goes to a loopback API server. Kueue's
preemption (the TrainJob suspended: its pods get SIGTERM) checkpoints the job and requeues it, and
the job resumes on the pods of the next admission and finishes once."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid

import pytest
from django.conf import settings as django_settings
from django.db import connection

from training import agent
from training.models import TRAINJOB_LABEL, JobState, Node, NodeState, TrainingJob
from training.scheduler.models import JobScheduling
from training.services import job_create, job_work_dir
from training.tests.factories import make_demo_dataset
from training.tests.workers import wait_for, worker_env
from workspaces.models import Event
from workspaces.testing.kube_api import fake_api_server

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="agent processes share the test database only on a server (DATABASE_URL)",
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


def start_pod(trainjob: str, log) -> tuple[str, subprocess.Popen]:
    """A pod of ``trainjob``: the runtime's command, named after the pod."""
    name = f"{trainjob}-node-0-0-{uuid.uuid4().hex[:5]}"
    process = subprocess.Popen(
        [sys.executable, "manage.py", "node_agent", "--name", name, "--slots", "1"],
        cwd=django_settings.BASE_DIR,
        env={**worker_env(), agent.TRAINJOB_ENV: trainjob},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    return name, process


def test_kueue_preempts_the_trainjob_and_the_job_resumes_on_its_next_pods(
    workspace, tmp_path, settings
):
    dataset = make_demo_dataset(workspace, scale=0.05)
    log = tmp_path / "pods.log"
    pods: list[subprocess.Popen] = []
    with fake_api_server() as cluster:
        settings.TRAINING_BACKEND = "kueue"
        settings.TRAINING_KUBECONFIG = str(cluster.write_kubeconfig(tmp_path / "kubeconfig"))
        settings.TRAINING_K8S_NAMESPACE = "rankops"
        job = job_create(
            actor=None, workspace=workspace, name="on-kueue", dataset=dataset,
            template="fine_ranking", params=SLOW, cpu_milli=1000, memory_mb=256,
        )  # fmt: skip
        trainjob = f"rankops-job-{job.pk}"
        try:
            submitted = JobScheduling.objects.unscoped().filter(job=job, trainjob=trainjob)
            wait_for(
                submitted.exists,
                timeout=30,
                what="the TrainJob",
                tick=True,
            )
            first, process = start_pod(trainjob, log)  # Kueue admitted it: its pod starts
            pods.append(process)
            wait_for(
                lambda: _job(job.pk).checkpoint_step >= 6 and _job(job.pk).state == "running",
                timeout=120,
                what="a checkpoint on the first pod",
                tick=True,
            )
            assert _job(job.pk).node.name == first
            process.send_signal(signal.SIGTERM)  # Kueue suspends the TrainJob: the pod goes
            process.wait(timeout=90)
            stopped = _job(job.pk)
            assert stopped.state in (JobState.PREEMPTED, JobState.PENDING, JobState.ADMITTED)
            assert Node.objects.get(name=first).state == NodeState.CORDONED
            second, process = start_pod(trainjob, log)  # Kueue admits it again: a new pod
            pods.append(process)
            wait_for(lambda: _job(job.pk).is_terminal, timeout=180, what="the job", tick=True)
        finally:
            for process in pods:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in pods:
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
        wait_for(lambda: trainjob not in str(cluster.objects), timeout=30, what="delete", tick=True)
    job = _job(job.pk)
    text = (job_work_dir(job) / agent.LOG_FILE).read_text()
    assert job.state == JobState.SUCCEEDED, (job.state_reason, log.read_text()[-3000:])
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
