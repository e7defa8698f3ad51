"""Per-workspace concurrency for heavy Celery tasks: a workspace holds at most its policy's
``max_concurrent_tasks`` worker slots at once, so one tenant's backlog cannot occupy every slot.

A task that finds its workspace at the limit does not wait in the slot: it re-enqueues itself
with a countdown and returns. Slots are rows (``TaskSlot``) with a short lease (``ttl_s``) that
the holder renews from a background thread while its block runs, so a worker that dies holding
one (SIGKILL, OOM) frees it within ``ttl_s``, however long a live holder works. (With a fixed
15-minute time to live, a SIGKILLed worker left its workspace without materialisation for
15 minutes: found by the ``faults`` bench, ``bench/areas/faults.py``.)::

    with workspace_task_slot(workspace_id=group.workspace_id, kind="features.materialize") as held:
        if not held:
            return my_task.apply_async(args=[...], countdown=SLOT_RETRY_SECONDS)
        ...the work...
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from workspaces.models import TaskSlot
from workspaces.selectors import workspace_policy

# How long a task waits before it tries again for a slot of its workspace.
SLOT_RETRY_SECONDS = 5.0
# A slot whose lease was not renewed within this long (its worker died) is free again. The
# holder renews it every third of that.
DEFAULT_TTL_SECONDS = 30.0

logger = logging.getLogger(__name__)


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


def task_slot_renew(slot: TaskSlot, *, ttl_s: float = DEFAULT_TTL_SECONDS) -> bool:
    """Extend a held slot's lease by ``ttl_s`` from now; False when it is no longer this
    holder's (it expired and another task took it over)."""
    expires_at = timezone.now() + timedelta(seconds=ttl_s)
    renewed = (
        TaskSlot.objects.for_workspace(slot.workspace_id)
        .filter(pk=slot.pk, expires_at=slot.expires_at)
        .update(expires_at=expires_at)
    )
    if renewed:
        slot.expires_at = expires_at
    return bool(renewed)


class SlotLease:
    """Renews a held slot every ``ttl_s / 3`` from a daemon thread until ``stop()``; the
    thread's own database connection is closed when it ends."""

    def __init__(self, slot: TaskSlot, ttl_s: float) -> None:
        self.slot, self.ttl_s = slot, ttl_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, name="task-slot-lease", daemon=True)

    def start(self) -> SlotLease:
        self.thread.start()
        return self

    def run(self) -> None:
        try:
            while not self.done.wait(self.ttl_s / 3):
                try:
                    if not task_slot_renew(self.slot, ttl_s=self.ttl_s):
                        logger.warning("%s was taken over; not renewing it", self.slot)
                        return
                except Exception:  # a failed renewal is retried next time
                    logger.warning("renewing %s failed", self.slot, exc_info=True)
        finally:
            connection.close()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


@contextmanager
def workspace_task_slot(
    *, workspace_id: int, kind: str, ttl_s: float = DEFAULT_TTL_SECONDS
) -> Iterator[bool]:
    """Hold one of the workspace's slots for the block, its lease renewed meanwhile; yields
    whether one was free."""
    slot = task_slot_acquire(workspace_id=workspace_id, kind=kind, ttl_s=ttl_s)
    lease = SlotLease(slot, ttl_s).start() if slot is not None else None
    try:
        yield slot is not None
    finally:
        if lease is not None:
            lease.stop()
        if slot is not None:
            task_slot_release(slot)
