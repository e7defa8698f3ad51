"""A real Celery worker on the configured broker (Redis when REDIS_URL is set, else the
filesystem transport) runs the heartbeat task, and /readyz reports it."""

from __future__ import annotations

import time
import uuid

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.core.cache import cache

from config.celery import app
from workspaces.health import WORKER_HEARTBEAT_KEY
from workspaces.tasks import worker_heartbeat

pytestmark = pytest.mark.celery_worker


# Celery's Django fixup closes the database connections when a worker starts; inside the
# transaction that a plain `db` test runs in, that would break the test's own connection.
@pytest.mark.django_db(transaction=True)
def test_heartbeat_runs_on_a_real_worker_and_readyz_reports_it(client):
    queue = f"test-{uuid.uuid4().hex[:12]}"  # a queue no other worker (e.g. `make run`'s) reads
    cache.delete(WORKER_HEARTBEAT_KEY)
    with start_worker(app, pool="solo", perform_ping_check=False, queues=[queue]):
        worker_heartbeat.apply_async(queue=queue)
        deadline = time.monotonic() + 30
        while cache.get(WORKER_HEARTBEAT_KEY) is None and time.monotonic() < deadline:
            time.sleep(0.2)
    beat = cache.get(WORKER_HEARTBEAT_KEY)
    assert beat is not None, "the worker never ran the task"

    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["checks"] == {"database": "ok", "cache": "ok", "broker": "ok"}
    assert body["worker_last_heartbeat"] == beat
    expected = "redis" if settings.REDIS_URL else "filesystem"
    assert body["broker"] == expected


def test_beat_schedules_the_heartbeat():
    entry = settings.CELERY_BEAT_SCHEDULE["worker-heartbeat"]
    assert entry["task"] == worker_heartbeat.name
    assert entry["task"] in app.tasks


def test_readyz_reports_an_unreachable_broker(client, db):
    # A real broker URL on a port nothing listens on: the probe must say so, not hang.
    original = app.conf.broker_url
    app.conf.broker_url = "redis://127.0.0.1:9/0"
    try:
        started = time.monotonic()
        response = client.get("/readyz")
        elapsed = time.monotonic() - started
    finally:
        app.conf.broker_url = original
    assert response.status_code == 503
    assert response.json()["checks"]["broker"].startswith("error:")
    assert response.json()["checks"]["database"] == "ok"
    assert elapsed < 15


def test_healthz_answers_any_host(client):
    response = client.get("/healthz", HTTP_HOST="10.1.2.3:8000")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
