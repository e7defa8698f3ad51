"""Helpers for tests that run jobs on a real Celery worker consuming a node queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from training import agent
from training.models import Node
from workspaces.testing.workers import embedded_worker


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str, tick: bool = False) -> Any:
    """Poll ``predicate`` until it is truthy (its value) or ``timeout`` seconds pass (fail),
    running the reconciler and a scheduler tick before each poll when ``tick``."""
    from training.scheduler.failover import reconcile
    from training.scheduler.tick import schedule_tick

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tick:
            reconcile()
            schedule_tick()
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@contextmanager
def node_worker(prefix: str = "t", *, platform: bool = False) -> Iterator[Node]:
    """A real (embedded, solo-pool) Celery worker on a fresh node queue; yields the node its
    heartbeat registered. ``platform`` also consumes the default queue (pipelines, the
    scheduler's ticks), as the `make run` worker does."""
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    queues = [f"node.{name}", *(["celery"] if platform else [])]
    try:
        with embedded_worker(queues):
            yield wait_for(
                lambda: Node.objects.filter(name=name).first(), timeout=30, what="the node"
            )
    finally:
        agent.HEARTBEATS.shutdown()  # the embedded test worker sends no worker_shutdown


def execute_in_thread(job_id: int) -> tuple[threading.Thread, dict[str, Any]]:
    """``agent.execute_job(job_id)`` on a thread of its own (its own database connection); the
    returned dict gets the job's final state as ``"state"``."""
    result: dict[str, Any] = {}

    def target() -> None:
        from django.db import connection

        try:
            result["state"] = agent.execute_job(job_id)
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def worker_env() -> dict[str, str]:
    """The settings a separate worker process needs to share this test's database, broker,
    artifacts, MLflow store and sandbox."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_ENV": "development",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
        f"/{db['NAME']}",
        "ARTIFACT_ROOT": str(settings.ARTIFACT_ROOT),
        "MLFLOW_TRACKING_URI": settings.MLFLOW_TRACKING_URI,
        "MLFLOW_ARTIFACT_ROOT": settings.MLFLOW_ARTIFACT_ROOT,
        "TRAINING_SANDBOX_ROOT": str(settings.TRAINING_SANDBOX_ROOT),
        "PYTHONUNBUFFERED": "1",
        # The worker runs as development: it takes the suite's gate limits with it.
        "SERVING_LIMITS": json.dumps(settings.SERVING_LIMITS),
    }
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    return env


def start_worker_process(queue: str, log: Path) -> subprocess.Popen:
    """A worker *process* (solo pool) consuming ``queue``, sharing this test's database,
    broker and folders (PostgreSQL only: a second process cannot share the in-memory test
    database); its output appended to ``log``."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", "solo"),
            *("--queues", queue, "--without-mingle", "--without-gossip", "--loglevel", "INFO"),
        ],
        cwd=settings.BASE_DIR,
        env=worker_env(),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
