"""Two (here: four) ticks at once never place a job twice nor overfill a node."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from training.models import JobState, TrainingJob
from training.scheduler.tests.factories import make_job, make_node
from training.scheduler.tick import schedule_tick
from workspaces.models import Event

# Row locks (SELECT ... FOR UPDATE SKIP LOCKED) are what is under test; SQLite has none (Django
# drops the clause there and the tick falls back to an in-process lock), and its in-memory test
# database is not shared between threads, so this test needs PostgreSQL.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="row locks need PostgreSQL (DATABASE_URL)"
    ),
]


def test_parallel_ticks_never_double_place(workspace):
    nodes = [make_node(gpus=4, cpu_milli=64000, memory_mb=262144) for _ in range(3)]
    jobs = [make_job(workspace, gpu_count=1, cpu_milli=1000) for _ in range(20)]
    barrier = threading.Barrier(4)
    results, errors = [], []

    def run():
        try:
            barrier.wait()
            for _ in range(3):
                results.append(schedule_tick(limit=5))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    placed = TrainingJob.objects.unscoped().filter(pk__in=[j.pk for j in jobs])
    assert placed.filter(state=JobState.PLACED).count() == 12  # 3 nodes x 4 GPUs
    assert placed.filter(state=JobState.ADMITTED).count() == 8
    assert sum(r.get("placed", 0) for r in results) == 12
    # Each job was placed exactly once (one training.job.placed event each).
    events = Event.objects.unscoped().filter(verb="training.job.placed")
    ids = [e.refs.get(role="subject").object_id for e in events]
    assert len(ids) == len(set(ids)) == 12
    # No GPU holds more than one whole-GPU job.
    for node in nodes:
        on_node = placed.filter(node=node, state=JobState.PLACED)
        gpus = [g["index"] for job in on_node for g in job.assigned_gpus]
        assert len(gpus) == len(set(gpus)) <= 4
