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
def deliver_notifications(notification_ids: list[int]) -> dict[str, int]:
    """E-mail the recipients of these notifications and post them to the workspace's webhooks;
    each notification is delivered at most once, so a redelivered task sends nothing again."""
    from workspaces.notifications import notifications_deliver

    return notifications_deliver(notification_ids)
