"""The event log as the outbox: a consumer reads in commit order with a durable cursor.

The consumer under test writes one row per event it handles (a Notification whose verb names the
event) in the batch transaction, which makes "applied once" something the database shows.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.utils import timezone

from workspaces import outbox
from workspaces.events import Ref, event_record
from workspaces.models import ConsumerCursor, ConsumerGap, Event, Notification, Role
from workspaces.testing.factories import make_member
from workspaces.testing.sqlite import sqlite_busy_timeout

NAME = "test.recorder"


class Crash(BaseException):
    """Raised through everything, like a worker killed mid-batch: the transaction is lost."""


class Recorder:
    """A consumer's handler: records each ``test.*`` event as a row; can fail on one event."""

    def __init__(self, workspace, user) -> None:
        self.workspace, self.user = workspace, user
        self.fail_on: int | None = None
        self.failure: type[BaseException] = RuntimeError
        self.calls: list[int] = []

    def __call__(self, event: Event) -> None:
        self.calls.append(event.pk)
        Notification.objects.create(
            workspace=self.workspace, recipient=self.user, verb=f"seen.{event.pk}", title="seen"
        )
        if event.pk == self.fail_on:
            raise self.failure(f"handler broke on {event.pk}")

    def seen(self) -> list[int]:
        """Event ids whose row committed, once per row (a repeat would show twice)."""
        rows = Notification.objects.for_workspace(self.workspace).filter(verb__startswith="seen.")
        return sorted(int(v.split(".", 1)[1]) for v in rows.values_list("verb", flat=True))


@pytest.fixture
def recorder(workspace):
    handler = Recorder(workspace, make_member(workspace, Role.VIEWER))
    outbox.consumer_register(NAME, handler, verbs=["test.*"])
    outbox.consume(NAME)  # past the fixtures' own events
    yield handler
    outbox.consumer_unregister(NAME)


def record(workspace, verb="test.thing"):
    with transaction.atomic():
        return event_record(actor=None, workspace=workspace, verb=verb, refs=[Ref("thing", 1)])


def _event(pk, workspace, verb="test.thing", *, created_at=None):
    with transaction.atomic():
        event = Event(
            id=pk,
            workspace=workspace,
            verb=verb,
            actor_name="x",
            created_at=created_at or timezone.now(),
        )
        event.save()
    return event


@pytest.mark.django_db
def test_a_consumer_applies_matching_events_once_and_passes_the_rest(workspace, recorder):
    first = record(workspace)
    other = record(workspace, verb="dataset.created")
    second = record(workspace)
    run = outbox.consume(NAME)
    assert run.applied == 3 and not run.failed
    assert recorder.seen() == [first.pk, second.pk]
    assert ConsumerCursor.objects.get(name=NAME).last_event_id == second.pk
    assert other.pk not in recorder.calls
    assert outbox.consume(NAME).applied == 0
    assert recorder.seen() == [first.pk, second.pk]


@pytest.mark.django_db
def test_a_handler_that_raises_mid_batch_resumes_from_the_cursor_repeating_nothing(
    workspace, recorder
):
    events = [record(workspace) for _ in range(5)]
    recorder.fail_on = events[2].pk
    run = outbox.consume(NAME)
    assert run.failed and run.applied == 2
    assert f"event {events[2].pk}" in run.errors[0]
    cursor = ConsumerCursor.objects.get(name=NAME)
    assert cursor.last_event_id == events[1].pk
    assert cursor.failures == 1 and "handler broke" in cursor.last_error
    # The failed event's own write was rolled back with its savepoint.
    assert recorder.seen() == [events[0].pk, events[1].pk]

    recorder.fail_on = None
    run = outbox.consume(NAME)
    assert run.applied == 3 and not run.failed
    assert recorder.seen() == [e.pk for e in events]
    cursor.refresh_from_db()
    assert (cursor.last_event_id, cursor.failures, cursor.last_error) == (events[-1].pk, 0, "")


@pytest.mark.django_db
def test_a_consumer_killed_mid_batch_resumes_from_its_cursor_repeating_nothing(workspace, recorder):
    events = [record(workspace) for _ in range(4)]
    assert outbox.consume(NAME, limit=1).applied == 1
    recorder.fail_on, recorder.failure = events[2].pk, Crash
    with pytest.raises(Crash):
        outbox.consume(NAME)
    # The whole batch is gone: the row of the event before the crash too, and the cursor stayed.
    assert recorder.seen() == [events[0].pk]
    assert ConsumerCursor.objects.get(name=NAME).last_event_id == events[0].pk
    assert recorder.calls == [events[0].pk, events[1].pk, events[2].pk]

    recorder.fail_on = None
    assert outbox.consume(NAME).applied == 3
    assert recorder.seen() == [e.pk for e in events]


@pytest.mark.django_db
def test_not_yet_stops_before_the_event_without_counting_a_failure(workspace, recorder):
    first, second = record(workspace), record(workspace)
    waiting = {second.pk}

    def handler(event):
        if event.pk in waiting:
            raise outbox.NotYet("waits for another consumer")
        recorder(event)

    outbox.consumer_register(NAME, handler, verbs=["test.*"])
    run = outbox.consume(NAME)
    assert (run.applied, run.failed, run.more) == (1, False, False)
    cursor = ConsumerCursor.objects.get(name=NAME)
    assert (cursor.last_event_id, cursor.failures) == (first.pk, 0)
    waiting.clear()
    assert outbox.consume(NAME).applied == 1
    assert recorder.seen() == [first.pk, second.pk]


@pytest.mark.django_db
def test_an_event_committed_30_s_after_a_later_one_is_applied_late_once(workspace, recorder):
    start = record(workspace)
    outbox.consume(NAME)
    last = start.pk
    # Event last + 1 is still committing somewhere; last + 2 commits and is consumed.
    _event(last + 2, workspace)
    assert outbox.consume(NAME, gap_wait=0).applied == 1
    assert list(ConsumerGap.objects.values_list("event_id", flat=True)) == [last + 1]
    assert ConsumerCursor.objects.get(name=NAME).last_event_id == last + 2

    _event(last + 1, workspace, created_at=timezone.now() + timedelta(seconds=30))
    assert outbox.consume(NAME, gap_wait=0).applied == 1
    assert recorder.seen() == [last, last + 1, last + 2]
    assert not ConsumerGap.objects.exists()
    assert not ConsumerCursor.objects.get(name=NAME).has_gaps
    assert outbox.consume(NAME, gap_wait=0).applied == 0
    assert recorder.seen() == [last, last + 1, last + 2]


@pytest.mark.django_db
def test_a_young_hole_is_waited_for_and_an_old_one_forgotten(workspace, recorder):
    start = record(workspace)
    outbox.consume(NAME)
    last = start.pk
    _event(last + 2, workspace)
    # The hole is younger than the wait: the consumer holds before it.
    assert outbox.consume(NAME, gap_wait=60).applied == 0
    assert ConsumerCursor.objects.get(name=NAME).last_event_id == last
    assert outbox.consume(NAME, gap_wait=0).applied == 1
    forget = float(outbox.setting("OUTBOX_GAP_FORGET_SECONDS"))
    ConsumerGap.objects.update(seen_at=timezone.now() - timedelta(seconds=forget + 1))
    assert outbox.consume(NAME, gap_wait=0).applied == 0
    assert not ConsumerGap.objects.exists()  # a rolled-back id: forgotten
    _event(last + 1, workspace)  # would-be late event after the window: not applied
    assert outbox.consume(NAME, gap_wait=0).applied == 0
    assert recorder.seen() == [last, last + 2]


@pytest.mark.django_db
def test_a_new_consumer_can_start_after_the_history(workspace, recorder):
    old = record(workspace)
    outbox.consumer_register("test.late-comer", recorder, verbs=["test.*"])
    try:
        cursor = outbox.consumer_start_at_latest("test.late-comer")
        assert cursor.last_event_id == old.pk
        new = record(workspace)
        assert outbox.consume("test.late-comer").applied == 1
    finally:
        outbox.consumer_unregister("test.late-comer")
    assert recorder.seen() == [new.pk]


@pytest.mark.django_db
def test_one_failing_consumer_does_not_hold_back_the_others(workspace, recorder):
    def broken(event):
        raise RuntimeError("always")

    outbox.consumer_register("test.broken", broken, verbs=["test.*"])
    try:
        event = record(workspace)
        runs = outbox.consume_all()
    finally:
        outbox.consumer_unregister("test.broken")
    assert runs["test.broken"].failed and runs[NAME].applied >= 1
    assert recorder.seen() == [event.pk]


@pytest.mark.django_db(transaction=True)
def test_a_transaction_that_took_its_id_first_and_commits_last_is_consumed(workspace, recorder):
    """On PostgreSQL the later transaction commits first and the earlier id is applied late.
    SQLite has one writer at a time: the later write cannot commit while the earlier one is
    open, so ids come in commit order and no gap is left."""
    record(workspace)
    outbox.consume(NAME, gap_wait=0)
    took_id, release, done = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []
    slow_id: list[int] = []

    def slow_writer():
        try:
            with transaction.atomic():
                slow_id.append(record(workspace).pk)
                took_id.set()
                if not release.wait(timeout=30):
                    raise TimeoutError("the test never released the slow writer")
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)
        finally:
            connections.close_all()
            done.set()

    thread = threading.Thread(target=slow_writer)
    thread.start()
    assert took_id.wait(timeout=30)
    if connection.vendor == "postgresql":
        fast = record(workspace)
        assert outbox.consume(NAME, gap_wait=0).applied == 1
        assert fast.pk in recorder.seen() and slow_id[0] not in recorder.seen()
        release.set()
    else:
        with sqlite_busy_timeout(0.5), pytest.raises(OperationalError, match="locked"):
            record(workspace)
        release.set()
    assert done.wait(timeout=30)
    thread.join(timeout=30)
    assert not errors
    if connection.vendor != "postgresql":
        fast = record(workspace)
        assert fast.pk > slow_id[0]  # commit order
        assert outbox.consume(NAME, gap_wait=0).applied == 2
    else:
        assert outbox.consume(NAME, gap_wait=0).applied == 1
    seen = recorder.seen()
    assert seen.count(slow_id[0]) == 1 and seen.count(fast.pk) == 1
    assert not ConsumerGap.objects.exists()
