"""Celery tasks of the workspaces app: thin, idempotent, taking ids."""

from __future__ import annotations

from celery import shared_task
from django.core.cache import cache
from django.utils import timezone

from workspaces.health import WORKER_HEARTBEAT_KEY


@shared_task(name="workspaces.tasks.worker_heartbeat", ignore_result=True)
def worker_heartbeat() -> str:
    """Record that a worker is alive (beat sends it every 15 s); /readyz and the UI show it."""
    now = timezone.now().isoformat()
    cache.set(WORKER_HEARTBEAT_KEY, now, timeout=3600)
    return now


@shared_task(name="workspaces.tasks.deliver_notifications", ignore_result=True)
def deliver_notifications(notification_ids: list[int] | None = None) -> dict[str, int]:
    """Kept for messages queued before delivery moved to the event log: it drains the outbox
    (the notifications consumer finds these notifications through their events)."""
    return outbox_drain()


# At most one drain of the outbox consumers waits in the queue at a time, however many events
# commit (the key expires in case the queued run is lost; beat's catch-up covers that too).
DRAIN_QUEUED_KEY = "workspaces:outbox-drain:queued"
DRAIN_QUEUED_SECONDS = 15
# The pause before the follow-up of a run that found a cursor held by another worker.
DRAIN_FOLLOW_UP_DELAY = 0.5


@shared_task(name="workspaces.tasks.outbox_drain", ignore_result=True)
def outbox_drain() -> dict[str, int]:
    """Run every consumer of the event log over what committed after its cursor (queued after
    each commit that wrote an event, and by beat), then send the deliveries that are due.

    Each consumer works for ``OUTBOX_TASK_BUDGET_SECONDS`` at most; when one has more left, or
    another worker held its cursor, one follow-up run is queued."""
    from workspaces import notifications, outbox

    cache.delete(DRAIN_QUEUED_KEY)  # started: events committed from now on need another run
    runs = outbox.consume_all(
        seconds=float(outbox.setting("OUTBOX_TASK_BUDGET_SECONDS")), wait=False
    )
    if any(run.more for run in runs.values()):
        busy = any(run.busy for run in runs.values())
        enqueue_drain_once(countdown=DRAIN_FOLLOW_UP_DELAY if busy else None)
    sent = notifications.deliveries_send()
    return {**{name: run.applied for name, run in runs.items()}, **sent}


def enqueue_drain_once(*, countdown: float | None = None) -> None:
    """Queue a drain, unless one is queued and has not started yet (it will see everything
    committed before it starts)."""
    if not cache.add(DRAIN_QUEUED_KEY, "1", timeout=DRAIN_QUEUED_SECONDS):
        return
    options = {"countdown": countdown} if countdown else {}
    outbox_drain.apply_async(**options)


@shared_task(name="workspaces.tasks.deliveries_send", ignore_result=True)
def deliveries_send() -> dict[str, int]:
    """Send the e-mails and webhook attempts that are due (beat runs it; retries wait for their
    backoff). Safe to run in several workers at once: each attempt is claimed first."""
    from workspaces import notifications

    return notifications.deliveries_send()


@shared_task(name="workspaces.tasks.idempotency_sweep", ignore_result=True)
def idempotency_sweep() -> int:
    """Forget the kept answers of Idempotency-Keys older than IDEMPOTENCY_TTL_S."""
    from workspaces.idempotency import forget_expired

    return forget_expired()
