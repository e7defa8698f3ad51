"""The post-commit hook end to end: a committed event queues the projection, a real Celery worker
(Redis when REDIS_URL is set, else the filesystem broker) runs it, the graph has the event."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings
from django.db import OperationalError

from config.celery import app
from lineage.models import Node
from lineage.tasks import audit_scan, project_events
from lineage.tests.helpers import record
from workspaces.events import Ref
from workspaces.testing.factories import make_workspace
from workspaces.testing.waiting import wait_until
from workspaces.testing.workers import embedded_worker

pytestmark = pytest.mark.celery_worker


@pytest.mark.django_db(transaction=True)
def test_a_committed_event_is_projected_by_the_worker(settings):
    queue = f"test-{uuid.uuid4().hex[:12]}"  # a queue no other worker (e.g. `make run`'s) reads
    workspace = make_workspace(slug="worker-ws")
    settings.LINEAGE_QUEUE = queue
    with embedded_worker([queue]):
        record(
            workspace,
            "serving.deployment.created",
            [
                Ref("model_version", 3, "m3", role="input"),
                Ref("deployment", 4, "d4", role="output"),
            ],
        )
        wait_until(
            lambda: Node.objects.for_workspace(workspace).filter(kind="deployment").exists(),
            timeout=30,
            what="the worker to project the committed event",
            interval=0.2,
            retry_on=(OperationalError,),  # SQLite's shared in-memory test database: locked
        )
    deployment = Node.objects.for_workspace(workspace).get(kind="deployment")
    assert deployment.in_edges.get().src.key == "model_version:3"


def test_beat_runs_the_catch_up_and_the_audit_scan():
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert schedule["lineage-project"]["task"] == project_events.name
    assert schedule["lineage-audit-scan"]["task"] == audit_scan.name
    assert {project_events.name, audit_scan.name} <= set(app.tasks)
