import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _read_uncommitted(sender=None, connection=None, **_kwargs) -> None:
    if connection is not None and connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA read_uncommitted = 1")


@pytest.fixture(autouse=True)
def _sqlite_readers_do_not_block(request):
    """The embedded test database is SQLite in memory with a shared cache, where a reader and
    a writer of one table lock each other out at once (no busy timeout). These tests run the
    agent, a heartbeat, a worker and web requests side by side, as production does on
    PostgreSQL; letting readers read uncommitted rows (SQLite's shared-cache option) keeps them
    from failing on such locks. PostgreSQL runs are untouched."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    connection_created.connect(_read_uncommitted)
    # An open connection is set on its DB-API handle: a test without database access (no
    # django_db mark) may follow one that opened it, and Django's cursor would be refused.
    for connection in connections.all(initialized_only=True):
        if connection.vendor == "sqlite" and connection.connection is not None:
            connection.connection.execute("PRAGMA read_uncommitted = 1")
    yield
    connection_created.disconnect(_read_uncommitted)
    for connection in connections.all(initialized_only=True):
        if connection.vendor == "sqlite" and connection.connection is not None:
            connection.connection.execute("PRAGMA read_uncommitted = 0")
