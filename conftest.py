"""Fixtures shared by every app's tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from workspaces.models import Role
from workspaces.testing.factories import UserFactory, make_member, make_workspace, token_for

ONE_PASS_MARKERS = ("browser", "one_backend")
# A test that asks for none of these (nor the django_db mark) cannot touch the database.
DATABASE_FIXTURES = frozenset(
    {
        "db",
        "transactional_db",
        "django_db_reset_sequences",
        "django_db_serialized_rollback",
        "live_server",
        "client",
        "admin_client",
        "admin_user",
        "django_user_model",
    }
)
# Set by .ci/run in its embedded-defaults pass, which runs beside the server pass.
SERVER_PASS_BESIDE = "RANKOPS_SERVER_PASS_BESIDE"


def pytest_collection_modifyitems(config, items):
    """CI runs the suite twice, on PostgreSQL and Redis and on the embedded defaults, side by
    side on 2 cores. A test that checks what the database under it does not change runs in one
    pass only, so that the two passes share the slow ones instead of both running them:

    - ``browser`` or ``one_backend``: pages in Chromium over the API both passes test; an HTTP
      client of the API; processes that run on the embedded defaults whatever the suite's
      settings (gunicorn's recycling, ``make run``, the demo); files Spark and DuckDB write. It
      runs in the embedded-defaults pass; a run with ``DATABASE_URL`` set reports it skipped.
    - ``server_pass``: training children, node agents and Celery workers killed, preempted or
      tuned, whose database rows only record what the processes did; the query budgets, which
      count what the ORM asks; Schemathesis, whose inputs PostgreSQL refuses more of than
      SQLite. It runs in the server pass (the production stack); CI's embedded-defaults pass
      (``RANKOPS_SERVER_PASS_BESIDE=1``, set by .ci/run alone) reports it skipped. A plain
      ``make test`` runs it on either.

    A test that asks for no database (no ``django_db`` mark, no database fixture) cannot be
    changed by it, so it runs in the embedded-defaults pass too, unless it is marked
    ``every_pass`` (what it checks depends on the other services the settings switch: Redis as
    cache, broker or online store) or ``server_pass``.

    The permission matrix marks its cases one by one (``test_permission_matrix.matrix_cases``).

    ``RANKOPS_TEST_EVERY_PASS=1`` runs every test in every pass."""
    if os.environ.get("RANKOPS_TEST_EVERY_PASS") == "1":
        return
    if os.environ.get("DATABASE_URL"):
        markers = ONE_PASS_MARKERS
        reason = "runs once, in the embedded-defaults pass (the database does not change "
    elif os.environ.get(SERVER_PASS_BESIDE) == "1":
        markers = ("server_pass",)
        reason = "runs once, in the server pass beside this one (the database does not change "
    else:
        return
    reason += "what it checks); RANKOPS_TEST_EVERY_PASS=1 runs it here"
    once = pytest.mark.skip(reason=reason)
    server = bool(os.environ.get("DATABASE_URL"))
    for item in items:
        if any(item.get_closest_marker(name) for name in markers) or (
            server and _without_database(item)
        ):
            item.add_marker(once)


def _without_database(item) -> bool:
    """The test asks for no database and nothing keeps it in the server pass."""
    if any(item.get_closest_marker(m) for m in ("django_db", "every_pass", "server_pass")):
        return False
    return not DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))


@pytest.fixture
def workspace(db):
    return make_workspace()


@pytest.fixture
def other_workspace(db):
    return make_workspace()


@pytest.fixture
def members(workspace):
    """One user per role in ``workspace``, plus an outsider who belongs to no workspace."""
    users = {role: make_member(workspace, role) for role in Role.values}
    users["outsider"] = UserFactory()
    return users


@pytest.fixture
def api_client():
    return APIClient()


@pytest.fixture
def client_for():
    """An APIClient that authenticates as ``user`` with a real API token (None: anonymous)."""

    def build(user=None, *, workspaces=None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(user, workspaces=workspaces)}")
        return client

    return build


@pytest.fixture(scope="session", autouse=True)
def _remove_test_state_dir():
    """Each test run writes artifacts and the embedded online store under its own folder; the
    notebook servers its tests started (and left running) stop with it."""
    yield
    import shutil

    from django.conf import settings

    from training.notebooks import stop_started_here

    stop_started_here()

    shutil.rmtree(settings.TEST_STATE_DIR, ignore_errors=True)
    shutil.rmtree(settings.TRAINING_SANDBOX_ROOT, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_feature_stores(settings):
    """Offline files and online rows are keyed by database ids, which a rolled-back test database
    hands out again; start every test with empty stores."""
    import shutil

    shutil.rmtree(settings.ARTIFACT_ROOT, ignore_errors=True)
    yield
    from features import online_store

    store = online_store.get_online_store()
    if isinstance(store, online_store.RedisClusterOnlineStore):
        store.clear()
    elif isinstance(store, online_store.RedisOnlineStore):
        keys = list(store.client.scan_iter(match=f"{store.prefix}:*", count=1000))
        if keys:
            store.client.delete(*keys)
    else:
        connection = store._connection()
        connection.execute("DELETE FROM online_row")
        connection.execute("DELETE FROM online_coverage")


# Tables whose rows the database refuses to delete (the append-only event log's triggers,
# workspaces migration 0002): the test flush truncates them.
_APPEND_ONLY_TABLES = ("workspaces_event", "workspaces_eventref")


def _fast_postgresql_flush() -> None:
    """Flush PostgreSQL between transactional tests with DELETE instead of TRUNCATE.

    Django empties the database after every transactional test (``TransactionTestCase``, the
    live-server and real-worker tests) with one ``TRUNCATE`` of every table. PostgreSQL pays a
    per-table cost for TRUNCATE (new relation files), and with 62 tables it took 2.1 s per flush
    here, against 0.14 s for ``DELETE FROM`` each table plus one TRUNCATE of the two append-only
    event tables (5 flushes each on the loaded 2-core CI machine), which made about three
    minutes of CI. Foreign keys are deferrable on PostgreSQL, so the deletes run in any order
    within the flush's transaction. A flush that resets sequences keeps Django's own SQL.
    """
    from django.db.backends.postgresql.operations import DatabaseOperations

    original = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or not tables:
            return original(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        quote = self.quote_name
        statements = [
            f"DELETE FROM {quote(t)};"  # noqa: S608 - Django's own table names, quoted
            for t in tables
            if t not in _APPEND_ONLY_TABLES
        ]
        truncated = [quote(t) for t in tables if t in _APPEND_ONLY_TABLES]
        if truncated:
            statements.append(f"TRUNCATE {', '.join(truncated)} CASCADE;")
        return statements

    DatabaseOperations.sql_flush = sql_flush


_fast_postgresql_flush()

# The browser tests drive Debian's chromium (`apt-get install chromium`) through playwright;
# playwright's own browser downloads are not used.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def allow_orm_beside_playwright():
    """Let the ORM run in a browser test module while playwright's event loop is alive.

    Playwright's sync API keeps an asyncio event loop running in the main thread (on a greenlet).
    Django's ORM refuses to run while it sees a running loop (SynchronousOnlyOperation), yet these
    tests create their data, and pytest-django flushes the database, from that same thread. Nothing
    here is really concurrent: the ORM calls happen between browser steps, never inside the loop.
    The flag is restored when the module ends so the rest of the suite keeps Django's guard.
    """
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if previous is None:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="module")
def chromium(allow_orm_beside_playwright):
    """Debian's chromium, headless, for the tests of one module."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests drive Debian's chromium. "
            "Install it with `apt-get install chromium`."
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium, live_server):
    """A fresh browser page on the live server (its own cookies), 15 s per step (a loaded 2-core
    CI machine; auto-waiting returns as soon as the step is done)."""
    context = chromium.new_context(
        base_url=live_server.url, viewport={"width": 1280, "height": 800}
    )
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()
