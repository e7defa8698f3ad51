"""A read that finds its PostgreSQL connection gone is sent once more on a new connection.

Django checks a persistent connection at the start of each request (``CONN_HEALTH_CHECKS``), but
not between the queries of one: a server restart, a failover or ``pg_terminate_backend`` that
lands mid-request fails the next query, and the request answers 503. The ``faults`` bench saw
that on 4 of 31 pushes while every connection was terminated six times in 3 s (pushes that
had not yet reached the write: the token, workspace and group reads before it).

This execute wrapper (Django's documented ``connection.execute_wrapper`` hook, installed on
each new connection) retries a statement once, on a new connection, when all of these hold:

- it is a ``SELECT`` (repeating a read changes nothing; a write may have committed before
  its answer was lost, so writes are never repeated here: the push's own retry with its
  Idempotency-Key covers those, ``features.ingestion.batch_ingest_retrying``);
- no transaction is open (``in_atomic_block``: a transaction's earlier statements died with the
  connection, and repeating the last one alone would be wrong);
- the error says the connection is gone (``connection_lost``), not that the query failed;
- the cursor is a client-side one (a server-side cursor's portal died with its connection).

No library does this for Django (django-db-connection-pool and psycopg's pool check a
connection when it is handed out, not when it breaks under a query); it is small and the
retry conditions above are checked by ``workspaces/tests/test_db_reconnect.py`` on PostgreSQL.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import InterfaceError, OperationalError

logger = logging.getLogger(__name__)


# PostgreSQL's SQLSTATEs of a lost connection: class 08 (connection exception) and the server
# shutting down or restarting (admin_shutdown, crash_shutdown, cannot_connect_now).
LOST_STATES = frozenset({"57P01", "57P02", "57P03"})


def connection_lost(exc: BaseException) -> bool:
    """Whether a database error says the connection itself is gone (the server ended it, the
    socket broke, it was already closed), rather than that a statement failed on it."""
    if isinstance(exc, InterfaceError):  # "connection already closed"
        return True
    if not isinstance(exc, OperationalError):
        return False
    state = getattr(exc.__cause__, "sqlstate", None)
    if state:
        return state.startswith("08") or state in LOST_STATES
    # psycopg gives no SQLSTATE when the socket broke ("server closed the connection
    # unexpectedly", "consuming input failed"); SQLite's errors ("database is locked") are not
    # lost connections.
    return getattr(exc.__cause__, "__module__", "").startswith("psycopg")


def retry_read_on_lost_connection(execute, sql, params, many, context: dict[str, Any]):
    try:
        return execute(sql, params, many, context)
    except (OperationalError, InterfaceError) as exc:
        connection = context["connection"]
        wrapper = context["cursor"]
        if (
            connection.vendor != "postgresql"
            or many
            or connection.in_atomic_block
            or not str(sql).lstrip()[:6].upper() == "SELECT"
            or getattr(wrapper.cursor, "name", None)  # a server-side (named) cursor
            or not connection_lost(exc)
        ):
            raise
        logger.warning("database connection lost under a read; reading once more on a new one")
        connection.close()
        connection.ensure_connection()
        # The caller fetches from this wrapper: point it at a cursor of the new connection.
        wrapper.cursor = connection.create_cursor()
        return execute(sql, params, many, context)


def install(sender, connection, **kwargs) -> None:
    """``connection_created`` receiver: put the retry on the connection once (the wrapper list
    belongs to the thread's connection object and outlives each reconnect)."""
    if retry_read_on_lost_connection not in connection.execute_wrappers:
        connection.execute_wrappers.append(retry_read_on_lost_connection)
