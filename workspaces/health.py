"""Liveness and readiness probes: /healthz answers while the process serves; /readyz checks the
database, the cache and the Celery broker, and reports when a worker last beat."""

from __future__ import annotations

import time

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

WORKER_HEARTBEAT_KEY = "worker-heartbeat"


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _check_cache() -> None:
    probe = f"readyz-{time.monotonic_ns()}"
    cache.set(probe, 1, timeout=5)
    if cache.get(probe) != 1:
        raise RuntimeError("cache did not return what was written")
    cache.delete(probe)


def _check_broker() -> None:
    from config.celery import app

    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    for name, check in (
        ("database", _check_database),
        ("cache", _check_cache),
        ("broker", _check_broker),
    ):
        try:
            check()
            checks[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            checks[name] = f"error: {type(exc).__name__}"
    last_beat = cache.get(WORKER_HEARTBEAT_KEY)
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {
            "status": "ok" if ready else "unavailable",
            "checks": checks,
            "worker_last_heartbeat": last_beat,
            "database_vendor": connection.vendor,
            "broker": settings.CELERY_BROKER_URL.split("://", 1)[0],
        },
        status=200 if ready else 503,
    )
