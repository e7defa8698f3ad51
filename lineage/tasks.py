"""Celery tasks of the lineage app: the incremental projection and the audit scan."""

from __future__ import annotations

from celery import shared_task
from celery.signals import worker_ready

# At most one projection run is queued at a time, however many events commit (the key expires
# in case the queued run is lost; beat's catch-up covers that too).
FOLLOW_UP_KEY = "lineage:project-events:queued"
FOLLOW_UP_SECONDS = 15
# A short pause before the follow-up of a run that found the cursor held, so that it retries
# after the holder's current slice instead of spinning.
FOLLOW_UP_DELAY = 0.5


@shared_task(name="lineage.tasks.project_events", ignore_result=True)
def project_events() -> int:
    """Apply committed events after the cursor (queued after each commit, and by beat).

    It works for ``LINEAGE_TASK_BUDGET_SECONDS`` at most and then queues itself again for the
    rest, so a backlog or one huge event never holds a worker slot for long and other tasks
    (scheduling, pipelines) run in between. When another worker holds the cursor it returns at
    once instead of waiting on the lock, after making sure one follow-up run is queued (the
    holder may have read the log before this task's event committed). Runs are coalesced: at
    most one waits in the queue (``enqueue_projection_once``)."""
    from django.core.cache import cache

    from lineage.conf import setting
    from lineage.projection import project_for

    # Started: events committed from now on need another run.
    cache.delete(queued_key(setting("LINEAGE_QUEUE")))
    run = project_for(seconds=float(setting("LINEAGE_TASK_BUDGET_SECONDS")), wait=False)
    if run.more:
        enqueue_projection_once(countdown=FOLLOW_UP_DELAY if run.busy else None)
    if run.applied and setting("OPENLINEAGE_URL"):
        # The OpenLineage export (a consumer of the log) waits for the projection: wake it.
        from workspaces.services import outbox_drain_soon

        outbox_drain_soon()
    return run.applied


def queued_key(queue: str) -> str:
    """The cache key that says a projection run waits in ``queue``."""
    return f"{FOLLOW_UP_KEY}:{queue or 'default'}"


def enqueue_projection_once(*, countdown: float | None = None) -> None:
    """Queue a projection run, unless one is queued and has not started yet (it will see
    everything committed before it starts). So a burst of events, or a large event, keeps at
    most one projection task waiting in the queue, behind whatever other work arrived first."""
    from django.core.cache import cache

    from lineage.conf import setting

    queue = setting("LINEAGE_QUEUE")
    if not cache.add(queued_key(queue), "1", timeout=FOLLOW_UP_SECONDS):
        return
    options = {"queue": queue} if queue else {}
    if countdown:
        options["countdown"] = countdown
    project_events.apply_async(**options)


@shared_task(name="lineage.tasks.audit_scan", ignore_result=True)
def audit_scan() -> int:
    """Flag idle deployments ("use first, audit later"); each flag is an event."""
    from lineage.audit import audit_scan_idle

    return audit_scan_idle()


@worker_ready.connect
def catch_up_on_start(**_kwargs) -> None:
    """A worker that starts queues one projection run at once, clearing the "one is queued"
    mark first: the run that mark stood for may have died with a killed worker (on Redis its
    unacked message comes back only after the visibility timeout, an hour), and beat's catch-up
    comes up to 30 s later. Measured by the ``faults`` bench (worker_kill_push): the graph
    caught up 25-47 s after the restart before this, against the 10 s goal."""
    from django.core.cache import cache

    from lineage.conf import setting

    try:
        cache.delete(queued_key(setting("LINEAGE_QUEUE")))
        enqueue_projection_once()
    except Exception:  # a worker must start even with its cache or broker down
        import logging

        logging.getLogger(__name__).warning("could not queue the lineage catch-up", exc_info=True)
