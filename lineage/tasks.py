"""Celery tasks of the lineage app: the incremental projection and the audit scan."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="lineage.tasks.project_events", ignore_result=True)
def project_events() -> int:
    """Apply every committed event after the cursor (queued after each commit, and by beat)."""
    from lineage.projection import project

    return project()


@shared_task(name="lineage.tasks.audit_scan", ignore_result=True)
def audit_scan() -> int:
    """Flag idle deployments ("use first, audit later"); each flag is an event."""
    from lineage.audit import audit_scan_idle

    return audit_scan_idle()
