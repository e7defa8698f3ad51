"""SQLite's one writer at a time, in tests that show a second writer being refused."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, connection, connections


@contextmanager
def sqlite_busy_timeout(seconds: float) -> Iterator[None]:
    """Within the block, a write that finds the database locked gives up after ``seconds``
    instead of the platform's busy timeout (20 s, made for a web server and a worker sharing the
    file): in this thread's open connection and in connections other threads open meanwhile.
    Nothing happens on another database."""
    if connection.vendor != "sqlite":
        yield
        return
    options = connections.settings[DEFAULT_DB_ALIAS].setdefault("OPTIONS", {})
    saved = options.get("timeout")
    options["timeout"] = seconds
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
    try:
        yield
    finally:
        if saved is None:
            options.pop("timeout", None)
        else:
            options["timeout"] = saved
        if connection.connection is not None:
            with connection.cursor() as cursor:
                cursor.execute(f"PRAGMA busy_timeout = {int((saved or 5) * 1000)}")
