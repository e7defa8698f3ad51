"""Events that commit after a later one: the projection remembers the hole and applies them late.

One case per backend with explicit ids (a hole the cursor passes, then the event that fills it,
written half a minute of event time later), and on PostgreSQL the real thing: a transaction that
took its event id first and commits after another transaction's event was projected.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.utils import timezone

from lineage import projection
from lineage.models import CursorGap, Edge, Node, Usage
from lineage.projection import project
from lineage.tests.helpers import record
from workspaces.events import Ref
from workspaces.models import Event
from workspaces.testing.sqlite import sqlite_busy_timeout


@pytest.fixture(autouse=True)
def artifact_root(settings, tmp_path):
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")


def _event(pk, workspace, verb, refs, *, created_at=None, resources=None):
    with transaction.atomic():
        event = Event(
            id=pk,
            workspace=workspace,
            verb=verb,
            actor_name="x",
            created_at=created_at or timezone.now(),
            resources=resources or {},
        )
        event.save()
        for kind, object_id, label, role in refs:
            event.refs.model(
                event=event, kind=kind, object_id=object_id, label=label, role=role
            ).save()
    return event


@pytest.mark.django_db
def test_an_event_committed_30_s_after_a_later_one_is_projected_once(workspace):
    record(workspace, "dataset.created", [Ref("dataset", 1, "d1")])
    project()
    last = Event.objects.unscoped().order_by("-id").first().pk
    # Event last + 1 is still committing somewhere; last + 2 commits and is projected.
    _event(last + 2, workspace, "dataset.created", [("dataset", "2", "d2", "subject")])
    assert project(gap_wait=0) == 1
    assert list(CursorGap.objects.values_list("event_id", flat=True)) == [last + 1]

    # Half a minute later the first transaction commits: its event is applied, once.
    late_at = timezone.now() + timedelta(seconds=30)
    _event(
        last + 1,
        workspace,
        "training.job.succeeded",
        [("training_job", "7", "job 7", "subject"), ("dataset", "2", "d2", "input")],
        created_at=late_at,
        resources={"cpu_hours": 2.0},
    )
    assert project(gap_wait=0) == 1
    job = Node.objects.for_workspace(workspace).get(kind="training_job", object_id="7")
    dataset = Node.objects.for_workspace(workspace).get(kind="dataset", object_id="2")
    assert Edge.objects.for_workspace(workspace).filter(src=dataset, dst=job).exists()
    assert Usage.objects.for_workspace(workspace).filter(event_id=last + 1).count() == 1
    assert not CursorGap.objects.exists()
    assert project(gap_wait=0) == 0
    assert Usage.objects.for_workspace(workspace).filter(event_id=last + 1).count() == 1


@pytest.mark.django_db
def test_a_late_event_does_not_move_a_status_backwards(workspace):
    record(workspace, "dataset.created", [Ref("dataset", 1, "d1")])
    project()
    last = Event.objects.unscoped().order_by("-id").first().pk
    subject = [("training_job", "9", "job 9", "subject")]
    _event(last + 2, workspace, "training.job.succeeded", subject)
    project(gap_wait=0)
    # The older "running" event commits after "succeeded" was projected.
    _event(last + 1, workspace, "training.job.running", subject)
    assert project(gap_wait=0) == 1
    node = Node.objects.for_workspace(workspace).get(kind="training_job", object_id="9")
    assert (node.status, node.last_event_id) == ("succeeded", last + 2)


@pytest.mark.django_db
def test_a_gap_is_forgotten_after_the_forget_window_and_capped(workspace, settings):
    record(workspace, "dataset.created", [Ref("dataset", 1, "d1")])
    project()
    last = Event.objects.unscoped().order_by("-id").first().pk
    settings.LINEAGE_GAP_MAX = 3
    _event(last + 6, workspace, "dataset.created", [("dataset", "6", "d6", "subject")])
    assert project(gap_wait=0) == 1
    # Five ids are missing; only the newest three are kept.
    kept = sorted(CursorGap.objects.values_list("event_id", flat=True))
    assert kept == [last + 3, last + 4, last + 5]
    CursorGap.objects.filter(event_id=last + 3).update(
        seen_at=timezone.now()
        - timedelta(seconds=projection.setting("LINEAGE_GAP_FORGET_SECONDS"))
        - timedelta(seconds=1)
    )
    assert project(gap_wait=0) == 0
    assert sorted(CursorGap.objects.values_list("event_id", flat=True)) == [last + 4, last + 5]


@pytest.mark.django_db(transaction=True)
def test_a_transaction_that_took_its_id_first_and_commits_last_is_projected(workspace):
    """On PostgreSQL the later transaction commits first and the earlier id is applied late.
    SQLite has one writer at a time: the later write cannot commit while the earlier
    transaction is open, so ids come in commit order and no gap is ever left."""
    record(workspace, "dataset.created", [Ref("dataset", 1, "d1")])
    project(gap_wait=0)
    took_id, release, done = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def slow_writer():
        try:
            with transaction.atomic():
                record(workspace, "dataset.created", [Ref("dataset", 100, "slow")])
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
    nodes = Node.objects.for_workspace(workspace)
    if connection.vendor == "postgresql":
        record(workspace, "dataset.created", [Ref("dataset", 101, "fast")])
        assert project(gap_wait=0) == 1
        assert nodes.filter(object_id="101").exists()
        assert not nodes.filter(object_id="100").exists()
        release.set()
    else:
        with sqlite_busy_timeout(0.5), pytest.raises(OperationalError, match="locked"):
            record(workspace, "dataset.created", [Ref("dataset", 101, "fast")])
        release.set()
    assert done.wait(timeout=30)
    thread.join(timeout=30)
    assert not errors
    if connection.vendor == "postgresql":
        assert project(gap_wait=0) == 1
    else:
        record(workspace, "dataset.created", [Ref("dataset", 101, "fast")])
        events = Event.objects.for_workspace(workspace)
        ids = {
            object_id: events.get(refs__kind="dataset", refs__object_id=object_id).pk
            for object_id in ("100", "101")
        }
        assert ids["101"] > ids["100"]  # commit order
        assert project(gap_wait=0) == 2
    assert nodes.filter(object_id="100").exists() and nodes.filter(object_id="101").exists()
    assert not CursorGap.objects.exists()
