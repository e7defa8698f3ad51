"""A read whose PostgreSQL connection was terminated mid-request is read again on a new
connection (``workspaces.db_reconnect``); a write, or any statement in a transaction, is not
repeated and fails as before."""

from __future__ import annotations

import psycopg
import pytest
from django.db import InterfaceError, OperationalError, connection, transaction

from workspaces.db_reconnect import connection_lost
from workspaces.models import Workspace

on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="pg_terminate_backend is PostgreSQL's (SQLite has no connection to lose)",
)


def _terminate_this_connection() -> int:
    """``pg_terminate_backend`` on this thread's connection, from another one; its pid."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as other:
        assert other.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0] is True
    return pid


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_read_after_the_connection_was_terminated_is_answered_on_a_new_one(workspace):
    killed = _terminate_this_connection()
    assert Workspace.objects.filter(pk=workspace.pk).values_list("slug", flat=True)[0] == (
        workspace.slug
    )
    assert _backend_pid() != killed
    # Once more: the retry is installed on every new connection, not only the first.
    killed = _terminate_this_connection()
    assert list(Workspace.objects.filter(pk=workspace.pk).values_list("pk", flat=True)) == [
        workspace.pk
    ]
    assert _backend_pid() != killed


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_write_is_not_repeated(workspace):
    _terminate_this_connection()
    with pytest.raises(OperationalError):
        Workspace.objects.filter(pk=workspace.pk).update(description="after the cut")
    connection.close()
    workspace.refresh_from_db()
    assert workspace.description != "after the cut"


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_read_inside_a_transaction_is_not_repeated(workspace):
    with pytest.raises(OperationalError), transaction.atomic():
        _terminate_this_connection()
        Workspace.objects.filter(pk=workspace.pk).exists()
    connection.close()
    assert Workspace.objects.filter(pk=workspace.pk).exists()


def _django_error(cause: BaseException) -> OperationalError:
    error = OperationalError(str(cause))
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("cause", "lost"),
    [
        (psycopg.errors.AdminShutdown("terminating connection"), True),
        (psycopg.errors.ConnectionFailure("connection failure"), True),
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), False),
        (psycopg.errors.DeadlockDetected("deadlock detected"), False),
        (psycopg.errors.LockNotAvailable("could not obtain lock"), False),
    ],
)
def test_which_errors_are_a_lost_connection(cause, lost):
    assert connection_lost(_django_error(cause)) is lost
    assert connection_lost(InterfaceError("connection already closed"))
    assert not connection_lost(OperationalError("database is locked"))  # SQLite's
