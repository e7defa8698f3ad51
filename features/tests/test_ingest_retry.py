"""A push whose database connection is cut under it (a server restart, a failover,
``pg_terminate_backend``) is sent once more on a fresh connection when it has an Idempotency-Key,
and stored once; without a key the producer gets the error to retry itself."""

from __future__ import annotations

import json

import pytest
from django.db import OperationalError, connection, connections

from features.ingestion import batch_ingest_retrying
from features.models import Batch
from features.tests.factories import make_group, user_row
from workspaces.testing.factories import make_member

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="connections are terminated by the server: PostgreSQL (DATABASE_URL); the "
        "SQLite variant (a held write lock under a push loop) is in bench/tests/test_faults.py",
    ),
]


def _terminate_this_connection() -> None:
    """End this thread's connection from the server side, as pg_terminate_backend does."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()


def _body(start: int) -> bytes:
    return json.dumps({"rows": [user_row(i) for i in range(start, start + 3)]}).encode()


def _cut_inside_the_transaction(monkeypatch, times: int = 1) -> None:
    """Terminate the connection once the push's transaction has locked its group (the next
    statements, the batch's insert among them, fail with it)."""
    from features import ingestion

    real = ingestion.storage_quota_check
    left = [times]

    def cut_then_check(**kwargs):
        if left[0] > 0:
            left[0] -= 1
            _terminate_this_connection()
        return real(**kwargs)

    monkeypatch.setattr(ingestion, "storage_quota_check", cut_then_check)


def test_a_push_with_a_key_survives_its_connection_being_terminated(workspace, monkeypatch):
    member = make_member(workspace)
    group = make_group(workspace, actor=member)
    _terminate_this_connection()
    result = batch_ingest_retrying(
        actor=member, group=group, body=_body(0), format="json", idempotency_key="k-1"
    )
    assert not result.replayed and result.batch.rows == 3
    assert Batch.objects.for_workspace(workspace).filter(idempotency_key="k-1").count() == 1

    # Cut inside its transaction: the whole push is sent once more, and stored once.
    _cut_inside_the_transaction(monkeypatch)
    result = batch_ingest_retrying(
        actor=member, group=group, body=_body(20), format="json", idempotency_key="k-2"
    )
    assert not result.replayed and result.batch.rows == 3
    assert Batch.objects.for_workspace(workspace).filter(idempotency_key="k-2").count() == 1


def test_a_push_without_a_key_is_not_resent_once_it_began_writing(workspace, monkeypatch):
    member = make_member(workspace)
    group = make_group(workspace, actor=member)
    # Cut before it wrote anything: its first read is read again (workspaces.db_reconnect).
    _terminate_this_connection()
    batch_ingest_retrying(actor=member, group=group, body=_body(0), format="json")
    assert Batch.objects.for_workspace(workspace).count() == 1

    _cut_inside_the_transaction(monkeypatch)
    with pytest.raises(OperationalError):
        batch_ingest_retrying(actor=member, group=group, body=_body(10), format="json")
    connection.close()
    assert Batch.objects.for_workspace(workspace).count() == 1
