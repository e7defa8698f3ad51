"""The event log as the outbox: named consumers that each read it in order with a durable cursor.

Services write their state and their event in one transaction and nothing else; every side effect
(e-mail and webhook deliveries, online materialisation, OpenLineage export) is a consumer of the
log. A consumer is a name, a handler called once per event whose verb matches its patterns, and a
``ConsumerCursor`` row: the last event id it applied. Each batch is one transaction that locks the
cursor, calls the handler for the events after it and moves the cursor, so the handler's own
database writes and the cursor commit together: a consumer killed mid-batch resumes from its
cursor and repeats nothing visible. A handler that raises stops its batch before that event (the
events before it commit); the event is tried again on the next run. A handler that cannot apply
an event yet (it waits on another consumer) raises ``NotYet``, which stops the batch the same way
without counting as a failure. Side effects outside the database (an HTTP post) belong in a
later stage the handler queues (the notifications consumer writes delivery rows) or must be
idempotent at the receiver, since a crash before the commit sends them again.

Commit order vs id order (the technique of the lineage projection): a transaction that took a
smaller event id may commit after a larger one. A batch stops before a hole in the ids whose next
event is younger than ``OUTBOX_GAP_WAIT_SECONDS`` (the hole is probably a transaction about to
commit). Once it passes an older hole it remembers each missing id as a ``ConsumerGap``; every
batch first looks the gaps up again and applies the events that have committed since (late, but
once), and forgets a gap after ``OUTBOX_GAP_FORGET_SECONDS`` (a rolled-back transaction's id never
appears). At most ``OUTBOX_GAP_MAX`` gaps are kept per consumer (the oldest go first, logged).

Runs are driven by ``workspaces.tasks.outbox_drain``, queued once per committing transaction that
wrote an event (``schedule_after_commit``) and by beat as a catch-up.
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet, prefetch_related_objects
from django.utils import timezone

from workspaces.models import ConsumerCursor, ConsumerGap, Event

logger = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    # A hole in the ids younger than this may be a transaction still committing: wait for it.
    "OUTBOX_GAP_WAIT_SECONDS": 5.0,
    # A passed hole is looked up again for this long (a late commit is then applied).
    "OUTBOX_GAP_FORGET_SECONDS": 3600.0,
    # Most holes one consumer remembers at once.
    "OUTBOX_GAP_MAX": 10000,
    # Events read per batch (one transaction each).
    "OUTBOX_BATCH_SIZE": 500,
    # Seconds one drain task spends per consumer before it queues itself again for the rest.
    "OUTBOX_TASK_BUDGET_SECONDS": 2.0,
}

Handler = Callable[[Event], None]


def setting(name: str) -> Any:
    """An outbox knob: ``settings.<name>`` when set, else the default here."""
    return getattr(settings, name, DEFAULTS[name])


class NotYet(Exception):
    """Raised by a handler that cannot apply this event yet (it waits on something another
    consumer does first): the batch stops before the event, which is tried again later."""


@dataclass(frozen=True)
class Consumer:
    """A registered consumer: its cursor's name, the verbs it handles (``fnmatch`` patterns),
    its handler, and what to do after a batch that applied something commits."""

    name: str
    handler: Handler
    verbs: tuple[str, ...] = ("*",)
    after_commit: Callable[[], None] | None = None

    def wants(self, event: Event) -> bool:
        """Whether the handler is called for this event (the cursor passes every event)."""
        return any(fnmatch.fnmatchcase(event.verb, pattern) for pattern in self.verbs)


_CONSUMERS: dict[str, Consumer] = {}


def consumer_register(
    name: str,
    handler: Handler,
    *,
    verbs: Iterable[str] = ("*",),
    after_commit: Callable[[], None] | None = None,
) -> Consumer:
    """Register (or replace) a consumer of the event log; apps call it from ``ready()``. The
    handler runs inside the batch transaction and must be idempotent."""
    consumer = Consumer(name=name, handler=handler, verbs=tuple(verbs), after_commit=after_commit)
    _CONSUMERS[name] = consumer
    return consumer


def consumer_unregister(name: str) -> None:
    """Forget a consumer (its cursor row stays, so registering it again resumes there)."""
    _CONSUMERS.pop(name, None)


def consumers() -> list[Consumer]:
    """The registered consumers, in registration order."""
    return list(_CONSUMERS.values())


def consumer_get(name: str) -> Consumer:
    """One registered consumer; KeyError names it when none is."""
    try:
        return _CONSUMERS[name]
    except KeyError:
        raise KeyError(f"no outbox consumer named {name!r}") from None


@dataclass
class ConsumeRun:
    """What one bounded run of a consumer did: events applied (late ones included), whether
    events are left, whether another process held the cursor, and whether a handler failed."""

    applied: int = 0
    more: bool = False
    busy: bool = False
    failed: bool = False
    errors: list[str] = field(default_factory=list)


@dataclass
class _Batch:
    applied: int = 0
    more: bool = False
    busy: bool = False
    failed: bool = False
    error: str = ""


def _cursor_locked(name: str, *, wait: bool) -> ConsumerCursor | None:
    ConsumerCursor.objects.get_or_create(name=name)
    return ConsumerCursor.objects.select_for_update(skip_locked=not wait).filter(name=name).first()


def _apply(consumer: Consumer, event: Event, batch: _Batch) -> bool:
    """Call the handler for one event in a savepoint; False stops the batch before the event."""
    if not consumer.wants(event):
        return True
    try:
        with transaction.atomic():
            consumer.handler(event)
    except NotYet:
        return False
    except Exception as exc:
        logger.exception("outbox consumer %s failed on event %s", consumer.name, event.pk)
        batch.failed = True
        batch.error = f"event {event.pk}: {type(exc).__name__}: {exc}"[:2000]
        return False
    return True


def gaps_remember(
    gaps: QuerySet[Any],
    new_gap: Callable[[int, datetime], Any],
    *,
    first: int,
    passed: int,
    limit: int,
    label: str,
) -> bool:
    """Remember the ids ``first`` .. ``passed - 1`` a cursor is about to pass unseen, keeping at
    most ``limit`` gaps (the oldest go first, logged). ``gaps`` are that cursor's gap rows and
    ``new_gap(event_id, seen_at)`` builds an unsaved one. Shared by every reader of the log in
    id order (the outbox consumers and the lineage projection); returns whether any was kept."""
    if passed <= first:
        return False
    missing = range(max(first, passed - limit), passed)
    if len(missing) < passed - first:
        logger.warning(
            "%s: %d event ids missing before %d; keeping the newest %d as gaps",
            label,
            passed - first,
            passed,
            len(missing),
        )
    now = timezone.now()
    gaps.model.objects.bulk_create([new_gap(i, now) for i in missing], ignore_conflicts=True)
    extra = gaps.count() - limit
    if extra > 0:
        oldest = list(gaps.order_by("event_id").values_list("pk", flat=True)[:extra])
        gaps.model.objects.filter(pk__in=oldest).delete()
        logger.warning("%s: forgot the %d oldest gaps (more than %d kept)", label, extra, limit)
    return bool(missing)


def gaps_late_events(gaps: QuerySet[Any], *, forget_seconds: float) -> list[Event]:
    """Forget a cursor's gaps older than ``forget_seconds`` (a rolled-back transaction's id never
    appears) and return the events that have committed since under the remaining ids, in id
    order, with their workspace and refs loaded."""
    gaps.filter(seen_at__lt=timezone.now() - timedelta(seconds=forget_seconds)).delete()
    return list(
        Event.objects.unscoped()
        .filter(id__in=gaps.values("event_id"))
        .select_related("workspace")
        .prefetch_related("refs")
        .order_by("id")
    )


def _record_gaps(cursor: ConsumerCursor, first: int, passed: int) -> None:
    """Remember the ids ``first`` .. ``passed - 1`` the cursor is about to pass unseen."""
    if cursor.last_event_id == 0:
        return  # a fresh cursor starts at the first event it sees
    if gaps_remember(
        ConsumerGap.objects.filter(cursor=cursor),
        lambda event_id, seen_at: ConsumerGap(cursor=cursor, event_id=event_id, seen_at=seen_at),
        first=first,
        passed=passed,
        limit=max(0, int(setting("OUTBOX_GAP_MAX"))),
        label=f"outbox {cursor.name}",
    ):
        cursor.has_gaps = True


def _apply_late(consumer: Consumer, cursor: ConsumerCursor, batch: _Batch) -> bool:
    """Apply the events that committed after the cursor passed their ids and forget old gaps;
    False when a handler stopped on one (the batch ends there)."""
    gaps = ConsumerGap.objects.filter(cursor=cursor)
    late = gaps_late_events(gaps, forget_seconds=float(setting("OUTBOX_GAP_FORGET_SECONDS")))
    done: list[int] = []
    carry_on = True
    for event in late:
        if not _apply(consumer, event, batch):
            carry_on = False
            break
        logger.info("outbox %s: applied event %d late", consumer.name, event.pk)
        done.append(event.pk)
    if done:
        gaps.filter(event_id__in=done).delete()
        batch.applied += len(done)
    if not gaps.exists():
        cursor.has_gaps = False
    return carry_on


def _consume_batch(consumer: Consumer, size: int, gap_wait: float, wait: bool) -> _Batch:
    batch = _Batch()
    with transaction.atomic():
        cursor = _cursor_locked(consumer.name, wait=wait)
        if cursor is None:
            batch.busy = batch.more = True  # another process is consuming right now
            return batch
        carry_on = _apply_late(consumer, cursor, batch) if cursor.has_gaps else True
        events: list[Event] = []
        stopped = not carry_on
        if carry_on:
            events = list(
                Event.objects.unscoped()
                .filter(id__gt=cursor.last_event_id)
                .select_related("workspace")
                .order_by("id")[:size]
            )
            prefetch_related_objects([e for e in events if consumer.wants(e)], "refs")
            settle = timezone.now() - timedelta(seconds=gap_wait)
            expected = cursor.last_event_id + 1
            for event in events:
                if event.id != expected and gap_wait > 0 and event.created_at > settle:
                    stopped = True  # an earlier id may still be committing
                    break
                if not _apply(consumer, event, batch):
                    stopped = True
                    break
                _record_gaps(cursor, expected, event.id)
                cursor.last_event_id = event.id
                expected = event.id + 1
                batch.applied += 1
        if batch.failed:
            cursor.failures += 1
            cursor.last_error = batch.error
        elif batch.applied:
            cursor.failures, cursor.last_error = 0, ""
        cursor.save()
        if batch.applied and consumer.after_commit is not None:
            transaction.on_commit(consumer.after_commit, robust=True)
    batch.more = not stopped and len(events) == size
    return batch


def consume(
    name: str,
    *,
    seconds: float | None = None,
    limit: int | None = None,
    gap_wait: float | None = None,
    wait: bool = True,
) -> ConsumeRun:
    """Run one consumer over the events after its cursor, for at most ``seconds`` (and
    ``limit`` events); each batch is one transaction. ``wait=False`` returns at once when
    another process holds the cursor. A handler failure ends the run (tried again next run)."""
    consumer = consumer_get(name)
    size = max(1, int(setting("OUTBOX_BATCH_SIZE")))
    gap = float(setting("OUTBOX_GAP_WAIT_SECONDS") if gap_wait is None else gap_wait)
    deadline = None if seconds is None else time.monotonic() + seconds
    run = ConsumeRun()
    while limit is None or run.applied < limit:
        batch = _consume_batch(
            consumer, size if limit is None else min(size, limit - run.applied), gap, wait
        )
        run.applied += batch.applied
        run.more, run.busy = batch.more, batch.busy
        if batch.failed:
            run.failed = True
            run.errors.append(batch.error)
            run.more = False
        if not run.more or run.busy or (deadline is not None and time.monotonic() >= deadline):
            break
    return run


def consume_all(
    *, seconds: float | None = None, gap_wait: float | None = None, wait: bool = True
) -> dict[str, ConsumeRun]:
    """Run every registered consumer once (each for at most ``seconds``); a failing consumer
    does not hold the others back."""
    runs: dict[str, ConsumeRun] = {}
    for consumer in consumers():
        try:
            runs[consumer.name] = consume(
                consumer.name, seconds=seconds, gap_wait=gap_wait, wait=wait
            )
        except Exception as exc:  # one consumer's broken database state must not stop the rest
            logger.exception("outbox consumer %s could not run", consumer.name)
            runs[consumer.name] = ConsumeRun(failed=True, errors=[str(exc)[:2000]])
    return runs


def consumer_start_at_latest(name: str) -> ConsumerCursor:
    """Place a new consumer's cursor after the newest event, so that it does not replay the
    history written before it existed (its migration calls the same on deployment)."""
    newest = Event.objects.unscoped().order_by("-id").values_list("id", flat=True).first() or 0
    cursor, _ = ConsumerCursor.objects.get_or_create(name=name, defaults={"last_event_id": newest})
    return cursor


# --- the post-commit hook --------------------------------------------------------------------


def schedule_after_commit(sender: Any, instance: Event, created: bool, **kwargs: Any) -> None:
    """post_save of Event: once per transaction, queue a drain of the consumers after commit."""
    if not created or not _CONSUMERS:
        return
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        _enqueue_drain()
        return
    # Once per savepoint level (a callback of an enclosing level runs at the same commit; only
    # the level is compared so that a test's capture of on_commit callbacks sees its own).
    current = set(connection.savepoint_ids)
    if any(f is _enqueue_drain and sids == current for sids, f, _ in connection.run_on_commit):
        return
    transaction.on_commit(_enqueue_drain, robust=True)


def _enqueue_drain() -> None:
    from workspaces.tasks import enqueue_drain_once

    enqueue_drain_once()
