"""Per-workspace concurrency for heavy Celery tasks: a workspace holds at most its policy's
``max_concurrent_tasks`` worker slots at once, so one tenant's backlog cannot occupy every slot.

A task that finds its workspace at the limit does not wait in the slot: it re-enqueues itself
with a countdown and returns. Slots are rows (``TaskSlot``) with a time to live, so a worker
that dies holding one frees it after ``ttl_s``::

    with workspace_task_slot(workspace_id=group.workspace_id, kind="features.materialize") as held:
        if not held:
            return my_task.apply_async(args=[...], countdown=SLOT_RETRY_SECONDS)
        ...the work...
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from workspaces.models import TaskSlot
from workspaces.selectors import workspace_policy

# How long a task waits before it tries again for a slot of its workspace.
SLOT_RETRY_SECONDS = 5.0
# A slot not released within this long (its worker died) is free again.
DEFAULT_TTL_SECONDS = 15 * 60


def task_slot_acquire(
    *, workspace_id: int, kind: str, ttl_s: float = DEFAULT_TTL_SECONDS
) -> TaskSlot | None:
    """Take a free slot of the workspace, or None when all its slots are held."""
    now = timezone.now()
    with transaction.atomic():
        TaskSlot.objects.for_workspace(workspace_id).filter(expires_at__lte=now).delete()
    for index in range(workspace_policy(workspace_id).max_concurrent_tasks):
        try:
            with transaction.atomic():
                return TaskSlot.objects.create(
                    workspace_id=workspace_id,
                    slot=index,
                    kind=kind[:60],
                    expires_at=now + timedelta(seconds=ttl_s),
                )
        except IntegrityError:
            continue  # held by another task
    return None


def task_slot_release(slot: TaskSlot) -> None:
    """Give a slot back (a no-op when it already expired and was taken over)."""
    TaskSlot.objects.for_workspace(slot.workspace_id).filter(
        pk=slot.pk, expires_at=slot.expires_at
    ).delete()


@contextmanager
def workspace_task_slot(
    *, workspace_id: int, kind: str, ttl_s: float = DEFAULT_TTL_SECONDS
) -> Iterator[bool]:
    """Hold one of the workspace's slots for the block; yields whether one was free."""
    slot = task_slot_acquire(workspace_id=workspace_id, kind=kind, ttl_s=ttl_s)
    try:
        yield slot is not None
    finally:
        if slot is not None:
            task_slot_release(slot)
