"""Fair use of worker slots with a real Celery worker (Redis/PostgreSQL when configured, else the
filesystem broker and SQLite): one workspace's 50,000-input OpenLineage event is projected in
bounded slices, and another workspace's training job is placed meanwhile, on the same single
worker slot: while the large event is still half applied. (How long the placement waits is the
benchmarks' business; here the order decides.)"""

from __future__ import annotations

import uuid

import pytest
from django.db import OperationalError

from config.celery import app
from lineage.models import Cursor, Node
from lineage.openlineage import openlineage_event_record
from lineage.projection import CURSOR
from training.models import JobState, TrainingJob
from training.scheduler.tasks import tick
from training.scheduler.tests.factories import make_job, make_node
from workspaces.testing.factories import make_workspace
from workspaces.testing.waiting import wait_until
from workspaces.testing.workers import embedded_worker

pytestmark = [pytest.mark.celery_worker, pytest.mark.django_db(transaction=True)]

INPUTS = 50_000


def _poll(predicate, *, timeout: float, what: str):
    # SQLite: the worker is writing right now
    return wait_until(
        predicate, timeout=timeout, what=what, interval=0.1, retry_on=(OperationalError,)
    )


def _cursor() -> Cursor | None:
    return Cursor.objects.filter(name=CURSOR).first()


def _purge(queue: str) -> None:
    """Drop the follow-up runs still queued for the test's own queue."""
    with app.connection_for_write() as connection:
        connection.default_channel.queue_purge(queue)


def test_a_huge_event_is_projected_in_slices_while_another_workspaces_job_is_placed(settings):
    queue = f"test-{uuid.uuid4().hex[:12]}"  # a queue no other worker (e.g. `make run`'s) reads
    settings.LINEAGE_QUEUE = queue
    noisy, quiet = make_workspace(slug="noisy-ws"), make_workspace(slug="quiet-ws")
    make_node(cpu_milli=8000, memory_mb=8192)
    job = make_job(quiet, cpu_milli=1000, memory_mb=512)

    parsed = {
        "event_type": "COMPLETE",
        "event_time": "2026-11-01T00:00:00+00:00",
        "run_id": str(uuid.uuid4()),
        "job": (noisy.slug, "spark.wide"),
        "inputs": [(noisy.slug, f"table_{i}") for i in range(INPUTS)],
        "outputs": [(noisy.slug, "out")],
        "producer": "",
    }
    # Committing it queues the projection on ``queue`` (the post-commit hook).
    event = openlineage_event_record(actor=None, workspace=noisy, parsed=parsed)
    try:
        with embedded_worker([queue]):
            # The worker's one slot is busy with the event ...
            _poll(
                lambda: (c := _cursor()) is not None and c.partial_event_id == event.pk,
                timeout=60,
                what="the projection of the large event to start",
            )
            # ... when the scheduler tick for the other workspace arrives behind it.
            # A connection of its own: the in-process worker's pooled ones are not shared.
            with app.connection_for_write() as connection:
                tick.apply_async(queue=queue, connection=connection)
            _poll(
                lambda: TrainingJob.objects.unscoped().get(pk=job.pk).state == JobState.PLACED,
                timeout=60,
                what="the quiet workspace's job to be placed",
            )
            cursor = _poll(_cursor, timeout=5, what="the cursor")
            projected = _poll(
                lambda: Node.objects.for_workspace(noisy).count(), timeout=5, what="nodes"
            )
    finally:
        _purge(queue)
    # The large event was still being applied, slice by slice, when the job was placed.
    assert cursor.partial_event_id == event.pk
    assert 0 < cursor.partial_refs_done < INPUTS + 1
    assert projected < INPUTS
