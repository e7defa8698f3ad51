"""The `make run` demo step trains a fine-ranking model on the generated demo data through the
real path: dataset from the demo feature groups, job, placement on the local node, the agent."""

from __future__ import annotations

import io
import uuid

import pytest
from django.core.management import call_command

from training import agent, demo
from training.models import JobMetric, JobState, Node, TrainingJob
from workspaces.models import Workspace
from workspaces.testing.workers import embedded_worker

pytestmark = [pytest.mark.celery_worker, pytest.mark.django_db(transaction=True)]


@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_demo_step_trains_a_model_on_the_demo_data(live_server, monkeypatch):
    call_command("demo_setup")
    call_command("demo_features", base_url=live_server.url, scale=0.05, wait=5)
    queue = f"demo.{uuid.uuid4().hex[:10]}"  # not node.*: no second heartbeat for this row
    Node.objects.create(name=demo.LOCAL_NODE, queue=queue, cpu_milli=2000, memory_mb=4096)
    monkeypatch.setattr(demo, "PLACE_AFTER_S", 0.0)
    out = io.StringIO()
    try:
        with embedded_worker([queue]):
            demo.run_training_demo(live_server.url, out)
    finally:
        agent.HEARTBEATS.shutdown()
    feed = Workspace.objects.get(slug=demo.WORKSPACE)
    job = TrainingJob.objects.for_workspace(feed).get(name=demo.JOB)
    assert job.state == JobState.SUCCEEDED, (job.state_reason, out.getvalue())
    # The demo's holdout has a handful of clicks at this scale, so its AUC is measured but too
    # noisy to bound; what the model learned shows in its training loss.
    assert job.template == "fine_ranking" and 0.0 <= job.metrics["holdout"]["auc"] <= 1.0
    losses = list(
        JobMetric.objects.for_workspace(feed)
        .filter(job=job, name="loss")
        .order_by("step")
        .values_list("value", flat=True)
    )
    assert len(losses) >= 4 and sum(losses[-2:]) < sum(losses[:2]), losses
    # A second run finds the trained job and adds nothing.
    again = io.StringIO()
    demo.run_training_demo(live_server.url, again)
    assert "already trained" in again.getvalue()
    assert TrainingJob.objects.for_workspace(feed).count() == 1
