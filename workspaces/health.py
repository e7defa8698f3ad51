"""Liveness and readiness probes: /healthz answers while the process serves; /readyz checks the
database, the cache, the Celery broker and that a worker consumes.

/readyz answers 503 while any of them is down, quickly (one connection attempt each, with a short
timeout), so the orchestrator stops routing to the pod; /healthz stays 200 (the process is fine,
restarting it would not bring Redis back).

"A worker consumes" is the freshest end-to-end signal there is: beat sends
``workspaces.tasks.worker_heartbeat`` every 15 s through the broker and a worker records the time
in the cache, so a heartbeat younger than ``READYZ_WORKER_MAX_AGE_S`` (60 s: three missed beats
plus slack) means beat, broker and a worker all worked a moment ago. Without one the web server
would accept jobs that nothing runs (the embedded broker's dead worker, issue 17); the check says
``error: no worker heartbeat`` or ``error: last worker heartbeat N s ago``.
``READYZ_WORKER_MAX_AGE_S=0`` switches it off (a web tier whose readiness must not follow the
workers')."""

from __future__ import annotations

import time
from datetime import datetime

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

WORKER_HEARTBEAT_KEY = "worker-heartbeat"
# Seconds the broker check may spend connecting.
BROKER_CONNECT_TIMEOUT = 1.0


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

    # The socket timeout bounds the first command too: a broker that accepts the connection and
    # never answers (a hung Redis, a half-open proxy) would otherwise hold /readyz forever.
    with app.connection_for_write(
        connect_timeout=BROKER_CONNECT_TIMEOUT,
        transport_options={"socket_timeout": BROKER_CONNECT_TIMEOUT},
    ) as conn:
        # One attempt: a probe that retries only delays the answer the orchestrator acts on.
        conn.ensure_connection(max_retries=0, timeout=BROKER_CONNECT_TIMEOUT)


def _worker_check(last_beat: str | None) -> str:
    """ "ok" when a worker recorded a heartbeat less than READYZ_WORKER_MAX_AGE_S ago."""
    max_age = settings.READYZ_WORKER_MAX_AGE_S
    if max_age <= 0:
        return "ok"
    if not last_beat:
        return "error: no worker heartbeat"
    try:
        age = time.time() - datetime.fromisoformat(last_beat).timestamp()
    except (TypeError, ValueError):
        return "error: unreadable worker heartbeat"
    if age > max_age:
        return f"error: last worker heartbeat {int(age)} s ago"
    return "ok"


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
    last_beat = None
    if checks["cache"] == "ok":
        try:
            last_beat = cache.get(WORKER_HEARTBEAT_KEY)
        except Exception:  # noqa: BLE001 - the cache went away since its check
            checks["cache"] = "error: unreachable"
    checks["worker"] = (
        _worker_check(last_beat) if checks["cache"] == "ok" else "error: cache unreachable"
    )
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
