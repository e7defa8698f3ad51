"""A real Celery worker (not eager) on a node queue takes a job from pending to succeeded:
the heartbeat registers the node, progress rows land in the database, metrics in MLflow."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings

from training import agent
from training.models import JobMetric, JobState, Node, TrainingJob
from training.tasks import run_job
from training.tests.factories import FAST, make_demo_dataset, place
from training.tests.workers import wait_for
from workspaces.models import Role
from workspaces.testing.factories import make_member
from workspaces.testing.workers import embedded_worker

pytestmark = pytest.mark.celery_worker


@pytest.mark.django_db(transaction=True)
def test_a_worker_on_a_node_queue_runs_a_job_to_success(workspace, client_for):
    client, job = _submit(workspace, client_for, name="worker-job")
    assert job.state == JobState.PENDING

    name = f"t{uuid.uuid4().hex[:10]}"
    queue = f"node.{name}"
    try:
        _run_on_worker(job, name, queue)
    finally:
        agent.HEARTBEATS.shutdown()  # the test worker sends no worker_shutdown
    _check_results(workspace, job, client)


@pytest.mark.django_db(transaction=True)
@pytest.mark.server_pass  # processes and workers: the database under them changes nothing
def test_a_job_with_two_workers_trains_with_two_ranks_in_the_sandbox(workspace, client_for):
    client, job = _submit(workspace, client_for, name="ddp-job", workers=2, cpu_milli=500)
    name = f"t{uuid.uuid4().hex[:10]}"
    try:
        _run_on_worker(job, name, f"node.{name}")
    finally:
        agent.HEARTBEATS.shutdown()
    assert job.state == JobState.SUCCEEDED, job.state_reason
    log = client.get(f"/api/v1/workspaces/{workspace.slug}/training-jobs/{job.pk}/log/").json()
    assert "data-parallel: 2 ranks (gloo)" in log["text"]
    assert job.model_path and job.metrics["holdout"]["auc"] > 0.5


def _submit(workspace, client_for, **fields):
    """A developer's fine_ranking job on a small demo dataset, through the API: (client, job)."""
    dataset = make_demo_dataset(workspace, scale=0.05)
    client = client_for(make_member(workspace, Role.DEVELOPER))
    body = {"template": "fine_ranking", "dataset": dataset.pk, "params": FAST, **fields}
    response = client.post(
        f"/api/v1/workspaces/{workspace.slug}/training-jobs/", body, format="json"
    )
    assert response.status_code == 201, response.content
    return client, TrainingJob.objects.for_workspace(workspace).get(pk=response.json()["id"])


def _run_on_worker(job, name, queue):
    with embedded_worker([queue]):
        node = wait_for(lambda: Node.objects.filter(name=name).first(), timeout=30, what="node")
        assert node.queue == queue and node.cpu_milli > 0 and node.memory_mb > 0
        place(job, node)
        run_job.apply_async(args=[job.pk], queue=queue)
        wait_for(
            lambda: TrainingJob.objects.unscoped().get(pk=job.pk).is_terminal,
            timeout=90,
            what="the job",
        )
    job.refresh_from_db()


def _check_results(workspace, job, client):
    from mlflow.tracking import MlflowClient

    assert job.state == JobState.SUCCEEDED, job.state_reason
    assert job.step == job.total_steps > 0
    assert job.samples_per_s > 0 and job.metrics["holdout"]["auc"] is not None
    rows = JobMetric.objects.for_workspace(workspace).filter(job=job)
    assert rows.filter(name="loss").count() >= 2
    assert rows.filter(name="holdout_auc").exists()

    tracking = MlflowClient(tracking_uri=settings.MLFLOW_TRACKING_URI)
    run = tracking.get_run(job.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["template"] == "fine_ranking"
    assert "loss" in run.data.metrics and "final_auc" in run.data.metrics
    history = tracking.get_metric_history(job.mlflow_run_id, "loss")
    assert len(history) >= 2
    artifacts = [a.path for a in tracking.list_artifacts(job.mlflow_run_id, "model")]
    assert "model/spec.json" in artifacts and "model/weights.pt" in artifacts

    detail = client.get(f"/api/v1/workspaces/{workspace.slug}/training-jobs/{job.pk}/metrics/")
    assert detail.status_code == 200 and any(r["name"] == "loss" for r in detail.json())
