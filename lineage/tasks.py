"""Celery tasks of the lineage app: the incremental projection and the audit scan."""

from __future__ import annotations

from celery import shared_task

# At most one follow-up projection run is queued at a time (it expires in case it is lost).
FOLLOW_UP_KEY = "lineage:project-events:follow-up"
FOLLOW_UP_SECONDS = 30
# A short pause before the follow-up, so that a run that found the cursor held retries after
# the holder's current slice instead of spinning.
FOLLOW_UP_DELAY = 0.5


@shared_task(name="lineage.tasks.project_events", ignore_result=True)
def project_events() -> int:
    """Apply committed events after the cursor (queued after each commit, and by beat).

    It works for ``LINEAGE_TASK_BUDGET_SECONDS`` at most and then queues itself again for the
    rest, so a backlog or one huge event never holds a worker slot for long and other tasks
    (scheduling, pipelines) run in between. When another worker holds the cursor it returns at
    once instead of waiting on the lock, after making sure one follow-up run is queued (the
    holder may have read the log before this task's event committed)."""
    from django.core.cache import cache

    from lineage.conf import setting
    from lineage.projection import project_for

    cache.delete(FOLLOW_UP_KEY)  # this is the follow-up (or makes it unnecessary)
    applied, more = project_for(seconds=float(setting("LINEAGE_TASK_BUDGET_SECONDS")), wait=False)
    if more:
        _enqueue_follow_up()
    return applied


def _enqueue_follow_up() -> None:
    """Queue one more projection run, unless one is already queued (at most one at a time).
    It goes to the back of the queue, behind whatever other work arrived meanwhile."""
    from django.core.cache import cache

    from lineage.conf import setting

    if not cache.add(FOLLOW_UP_KEY, "1", timeout=FOLLOW_UP_SECONDS):
        return
    queue = setting("LINEAGE_QUEUE")
    project_events.apply_async(countdown=FOLLOW_UP_DELAY, **({"queue": queue} if queue else {}))


@shared_task(name="lineage.tasks.audit_scan", ignore_result=True)
def audit_scan() -> int:
    """Flag idle deployments ("use first, audit later"); each flag is an event."""
    from lineage.audit import audit_scan_idle

    return audit_scan_idle()
