"""A real Celery worker on the configured broker (Redis when REDIS_URL is set, else the embedded
broker) runs the heartbeat task, and /readyz reports it; without a recent heartbeat it fails."""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from config.celery import app
from workspaces.health import WORKER_HEARTBEAT_KEY
from workspaces.tasks import worker_heartbeat
from workspaces.testing.waiting import wait_until
from workspaces.testing.workers import WorkerDidNotStop, embedded_worker

pytestmark = pytest.mark.celery_worker


# Celery's Django fixup closes the database connections when a worker starts; inside the
# transaction that a plain `db` test runs in, that would break the test's own connection.
@pytest.mark.django_db(transaction=True)
def test_heartbeat_runs_on_a_real_worker_and_readyz_reports_it(client):
    queue = f"test-{uuid.uuid4().hex[:12]}"  # a queue no other worker (e.g. `make run`'s) reads
    cache.delete(WORKER_HEARTBEAT_KEY)
    with embedded_worker([queue]):
        worker_heartbeat.apply_async(queue=queue)
        beat = wait_until(
            lambda: cache.get(WORKER_HEARTBEAT_KEY), timeout=30, what="the worker to run the task"
        )

    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["checks"] == {"database": "ok", "cache": "ok", "broker": "ok", "worker": "ok"}
    assert body["worker_last_heartbeat"] == beat
    expected = "redis" if settings.REDIS_URL else "embedded"
    assert body["broker"] == expected


def test_beat_schedules_the_heartbeat():
    entry = settings.CELERY_BEAT_SCHEDULE["worker-heartbeat"]
    assert entry["task"] == worker_heartbeat.name
    assert entry["task"] in app.tasks


class SilentBroker:
    """A TCP listener that accepts connections and never answers: a broker that hangs."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # the listener closed
            while True:
                self.accepted.append(self.server.accept()[0])

    def close(self) -> None:
        self.server.close()
        for conn in self.accepted:
            conn.close()


@pytest.mark.parametrize("outage", ["refused", "silent"])
# A probe that hangs fails at this bound (the test body only); how fast it answers is not asserted.
@pytest.mark.timeout(60, func_only=True)
def test_readyz_reports_an_unreachable_broker(client, db, outage):
    # A real broker URL on a port nothing listens on, or on a listener that never answers: the
    # probe must say so, after one connection attempt with its short timeout, not hang.
    silent = SilentBroker() if outage == "silent" else None
    original = app.conf.broker_url
    app.conf.broker_url = f"redis://127.0.0.1:{silent.port if silent else 9}/0"
    try:
        response = client.get("/readyz")
    finally:
        app.conf.broker_url = original
        if silent:
            silent.close()
    assert response.status_code == 503
    assert response.json()["checks"]["broker"].startswith("error:")
    assert response.json()["checks"]["database"] == "ok"
    if silent:
        assert len(silent.accepted) == 1, "the probe retried instead of answering"


def test_healthz_answers_any_host(client):
    response = client.get("/healthz", HTTP_HOST="10.1.2.3:8000")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_fails_while_no_worker_has_beaten(client, db):
    cache.delete(WORKER_HEARTBEAT_KEY)
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["checks"]["worker"] == "error: no worker heartbeat"
    assert body["checks"]["broker"] == "ok"  # the broker is up; nothing consumes it


def test_readyz_fails_once_the_last_heartbeat_is_too_old_and_recovers_with_a_new_one(
    client, db, settings
):
    stale = timezone.now() - timedelta(seconds=settings.READYZ_WORKER_MAX_AGE_S + 30)
    cache.set(WORKER_HEARTBEAT_KEY, stale.isoformat(), timeout=60)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["worker"].startswith("error: last worker heartbeat ")
    worker_heartbeat()  # what a worker runs for beat's message
    assert client.get("/readyz").status_code == 200
    cache.set(WORKER_HEARTBEAT_KEY, "not a time", timeout=60)
    assert client.get("/readyz").json()["checks"]["worker"] == "error: unreadable worker heartbeat"


def test_readyz_without_the_worker_check(client, db, settings):
    settings.READYZ_WORKER_MAX_AGE_S = 0
    cache.delete(WORKER_HEARTBEAT_KEY)
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"]["worker"] == "ok"


HOLD_RUNNING = threading.Event()
HOLD_RELEASE = threading.Event()


@app.task(name="workspaces.tests.test_celery_worker.hold")
def hold() -> None:
    """A task that runs until the test releases it (bounded, so nothing waits forever)."""
    HOLD_RUNNING.set()
    HOLD_RELEASE.wait(120)


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_outlives_its_stop_is_named_and_the_next_one_still_starts():
    # Stock start_worker left Celery's process-wide stop flag set when a worker's thread did
    # not exit: every later embedded worker stopped before it was ready and its test hung.
    stuck_queue, next_queue = (f"test-{uuid.uuid4().hex[:12]}" for _ in range(2))
    HOLD_RUNNING.clear()
    HOLD_RELEASE.clear()
    try:
        with (
            pytest.raises(
                WorkerDidNotStop, match=f"the worker on {stuck_queue} did not stop"
            ) as failure,
            embedded_worker([stuck_queue], shutdown_timeout=1),
        ):
            hold.apply_async(queue=stuck_queue)
            wait_until(HOLD_RUNNING.is_set, timeout=30, what="the held task to start")
    finally:
        HOLD_RELEASE.set()
    # What the stuck thread was doing: running the held task.
    assert "HOLD_RELEASE.wait(120)" in str(failure.value)
    assert failure.value.threads
    cache.delete(WORKER_HEARTBEAT_KEY)
    with embedded_worker([next_queue]):  # stock start_worker: hung in ensure_started here
        worker_heartbeat.apply_async(queue=next_queue)
        wait_until(lambda: cache.get(WORKER_HEARTBEAT_KEY), timeout=30, what="the next worker")
    # The next worker's stop stops the one that was stuck too (its task has ended).
    for thread in failure.value.threads:
        thread.join(30)
    assert not [t.name for t in failure.value.threads if t.is_alive()]
