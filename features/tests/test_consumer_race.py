"""Registering a consumer and retiring its feature group take the same row lock (issue 17):
whichever commits first wins, and a retired group never ends with a live consumer."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import OperationalError, connection, connections, transaction

from features import registry
from features.models import Consumer, FeatureGroup, Lifecycle
from features.tests.factories import make_group
from workspaces.exceptions import ConflictError
from workspaces.models import Role
from workspaces.testing.factories import make_member
from workspaces.testing.sqlite import sqlite_busy_timeout


def _waiting_on_a_lock() -> bool:
    if connection.vendor != "postgresql":
        return False  # SQLite refuses the second writer instead of queueing it
    with connection.cursor() as cursor:
        # Statistics views are a snapshot per transaction: take a fresh one for each look.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.django_db(transaction=True)
def test_a_consumer_registered_while_the_group_retires_is_refused(workspace):
    """On PostgreSQL the registration waits on the group's row lock and then sees the group
    retired. SQLite has one writer at a time: the registration is refused (database locked)
    while the retirement is open, and once it commits a registration sees it retired."""
    admin = make_member(workspace, Role.ADMIN)
    group = make_group(workspace, actor=admin, name="retiring")
    registry.feature_group_set_status(actor=admin, group=group, status=Lifecycle.DEPRECATED)
    outcome: list[BaseException | Consumer] = []

    def register():
        try:
            outcome.append(
                registry.consumer_register(
                    actor=admin, group=group, kind="dataset", object_id=1, label="d1"
                )
            )
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            outcome.append(exc)
        finally:
            connections.close_all()

    with sqlite_busy_timeout(0.5), transaction.atomic():
        registry.feature_group_set_status(actor=admin, group=group, status=Lifecycle.RETIRED)
        thread = threading.Thread(target=register)
        thread.start()
        deadline = time.monotonic() + 30
        while not _waiting_on_a_lock() and thread.is_alive():
            assert time.monotonic() < deadline, "the registration neither waited nor finished"
            time.sleep(0.05)
    thread.join(timeout=30)
    assert len(outcome) == 1, outcome
    if connection.vendor != "postgresql":
        assert isinstance(outcome[0], OperationalError) and "locked" in str(outcome[0])
        register()  # after the retirement committed
        outcome.pop(0)
    assert len(outcome) == 1 and isinstance(outcome[0], ConflictError), outcome
    assert "retired" in str(outcome[0])
    assert FeatureGroup.objects.unscoped().get(pk=group.pk).status == Lifecycle.RETIRED
    assert not Consumer.objects.for_workspace(workspace).filter(group=group, live=True).exists()
