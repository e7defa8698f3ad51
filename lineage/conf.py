"""Settings fragments of the lineage app, merged by config/settings.py, and its own knobs.

Keep this module free of Django imports at module level: settings import it. The knobs below are
read through ``setting(name)``, which lets ``settings.LINEAGE_*`` (or ``OPENLINEAGE_URL``)
override the defaults here.
"""

from __future__ import annotations

from typing import Any

BEAT_SCHEDULE: dict = {
    # Catch-up for events whose post-commit projection was missed (worker down, broker down).
    "lineage-project": {"task": "lineage.tasks.project_events", "schedule": 30.0},
    # "Use first, audit later": flag idle deployments and low-utilisation jobs.
    "lineage-audit-scan": {"task": "lineage.tasks.audit_scan", "schedule": 3600.0},
}
ENUM_NAME_OVERRIDES: dict = {}
TASK_ROUTES: dict = {}

DEFAULTS: dict[str, Any] = {
    # Price per unit in the platform's accounting currency. storage_gb is GB held per event.
    "LINEAGE_UNIT_PRICES": {
        "cpu_hours": 0.048,
        "gpu_hours": 2.48,
        "memory_gb_hours": 0.0065,
        "storage_gb": 0.023,
    },
    # A hole in the event ids younger than this may be a transaction still committing: the
    # projection stops before it and retries; once older, it passes the hole and remembers it.
    "LINEAGE_GAP_WAIT_SECONDS": 5.0,
    # A hole the projection passed is looked up again on every batch for this long (a late
    # commit is then applied); after it, the hole counts as a rollback.
    "LINEAGE_GAP_FORGET_SECONDS": 3600.0,
    # Most holes remembered at once (the oldest are forgotten first).
    "LINEAGE_GAP_MAX": 10000,
    # Events applied per projection batch (one transaction each).
    "LINEAGE_BATCH_SIZE": 2000,
    # Refs of one OpenLineage event applied per transaction; a bigger event takes several.
    "LINEAGE_REFS_PER_SLICE": 100,
    # Seconds one projection task works before it re-enqueues itself for the rest, so a backlog
    # (or one huge event) never holds a worker slot for long.
    "LINEAGE_TASK_BUDGET_SECONDS": 2.0,
    # Seconds a read spends bringing the graph up to date before it answers (at least a batch).
    "LINEAGE_CATCH_UP_SECONDS": 0.5,
    # Deepest traversal the API allows.
    "LINEAGE_MAX_DEPTH": 10,
    # Most nodes one traversal returns.
    "LINEAGE_MAX_NODES": 2000,
    # Deployments without a serving event for this long are flagged idle.
    "LINEAGE_IDLE_DEPLOYMENT_DAYS": 7,
    # Jobs whose reported utilisation is below this share are flagged.
    "LINEAGE_LOW_UTILISATION": 0.2,
    # The Celery queue the post-commit projection is sent to ("" = the default routing).
    "LINEAGE_QUEUE": "",
    # Where RunEvents go (an OpenLineage HTTP endpoint, e.g. Marquez); unset: nothing is sent.
    "OPENLINEAGE_URL": "",
    "OPENLINEAGE_API_KEY": "",
    "OPENLINEAGE_NAMESPACE_PREFIX": "rankops",
    # External namespaces and the workspace (slug) each one's events land in, e.g. an Airflow
    # deployment's "default": {"default": "feed-pctr"}; from the environment as
    # OPENLINEAGE_NAMESPACES="default=feed-pctr,airflow-prod=feed-pctr".
    "OPENLINEAGE_NAMESPACES": {},
    # The most bytes an intake body may inflate to (gzip).
    "OPENLINEAGE_MAX_INFLATED_BYTES": 4 * 1024 * 1024,
}

RESOURCE_KEYS = ("cpu_hours", "gpu_hours", "memory_gb_hours", "storage_gb")


def setting(name: str) -> Any:
    from django.conf import settings

    return getattr(settings, name, DEFAULTS[name])
