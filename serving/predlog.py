"""The prediction log: one ``PredictionLog`` row per acknowledged predict.

With Redis, the gateway appends each record to a Redis list *before* it answers (one RPUSH, off
the database), and ``predlog_flush`` moves them into the database in batches (a daemon thread in
each gateway process every second, and the Celery beat task ``serving.tasks.predlog_flush``), so
nothing acknowledged is lost even if a gateway process dies. Without Redis (embedded mode), the
row is inserted before the answer. Duplicate request ids of a workspace keep the first record.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from datetime import UTC, datetime

import orjson
from django.conf import settings
from django.db import close_old_connections
from redis.exceptions import LockError

log = logging.getLogger(__name__)


def list_key() -> str:
    return f"{settings.CACHE_KEY_PREFIX}:serving:predlog"


def lock_key() -> str:
    return f"{settings.CACHE_KEY_PREFIX}:serving:predlog:lock"


BATCH = 2000

_client = None
_flusher: threading.Thread | None = None
_flusher_lock = threading.Lock()


def redis_client():
    global _client
    if not settings.REDIS_URL:
        return None
    if _client is None:
        import redis

        _client = redis.Redis.from_url(settings.REDIS_URL)
    return _client


def _row(record: dict):
    from serving.models import PredictionLog

    return PredictionLog(
        workspace_id=record["w"],
        request_id=record["r"],
        unit_id=record["u"][:200],
        deployment_id=record["d"],
        deployment_name=record["dn"],
        model_version_id=record["v"],
        experiment_key=record["e"] or "",
        arm=record["a"] or "",
        n_candidates=record["n"],
        latency_ms=record["l"],
        created_at=datetime.fromtimestamp(record["t"], tz=UTC),
    )


def predlog_write(record: dict) -> None:
    """Durably accept one record (before the gateway answers)."""
    client = redis_client()
    if client is not None:
        client.rpush(list_key(), orjson.dumps(record))
        _ensure_flusher()
        return
    from serving.models import PredictionLog

    PredictionLog.objects.bulk_create([_row(record)], ignore_conflicts=True)


def _keep_references_valid(rows: list) -> None:
    """A deployment or version deleted since the predict keeps its log row (names and ids in
    the row's own columns) with a null reference; a deleted workspace's rows are dropped."""
    from serving.models import Deployment, ModelVersion
    from workspaces.models import Workspace

    workspaces = set(
        Workspace.objects.filter(pk__in={r.workspace_id for r in rows}).values_list("pk", flat=True)
    )
    deployments = set(
        Deployment.objects.unscoped()
        .filter(pk__in={r.deployment_id for r in rows if r.deployment_id})
        .values_list("pk", flat=True)
    )
    versions = set(
        ModelVersion.objects.unscoped()
        .filter(pk__in={r.model_version_id for r in rows if r.model_version_id})
        .values_list("pk", flat=True)
    )
    rows[:] = [r for r in rows if r.workspace_id in workspaces]
    for row in rows:
        if row.deployment_id not in deployments:
            row.deployment_id = None
        if row.model_version_id not in versions:
            row.model_version_id = None


def predlog_flush(max_batches: int = 50) -> int:
    """Move queued records into the database; returns how many were written."""
    client = redis_client()
    if client is None:
        return 0
    from serving.models import PredictionLog

    # redis-py's lock: a random token, released only by its holder (a Lua compare-and-delete),
    # expiring after 30 s should a flusher die holding it.
    lock = client.lock(lock_key(), timeout=30, blocking=False)
    if not lock.acquire():
        return 0
    written = 0
    try:
        for _ in range(max_batches):
            raw = client.lrange(list_key(), 0, BATCH - 1)
            if not raw:
                break
            rows = []
            for item in raw:
                try:
                    rows.append(_row(orjson.loads(item)))
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    log.warning("dropping a malformed prediction record")
            _keep_references_valid(rows)
            PredictionLog.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
            client.ltrim(list_key(), len(raw), -1)  # only after the rows are committed
            written += len(rows)
    finally:
        with contextlib.suppress(LockError):  # expired meanwhile: another flusher holds it now
            lock.release()
    return written


def _flush_forever() -> None:
    while True:
        time.sleep(getattr(settings, "SERVING_PREDLOG_FLUSH_S", 1.0))
        try:
            predlog_flush()
        except Exception:
            log.exception("prediction log flush failed")
        finally:
            close_old_connections()


def _ensure_flusher() -> None:
    global _flusher
    if _flusher is not None or not settings.SERVING_PREDLOG_FLUSH_THREAD:
        return
    with _flusher_lock:
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_forever, name="predlog-flush", daemon=True)
            _flusher.start()
