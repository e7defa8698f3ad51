"""Fixtures shared by every app's tests."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from workspaces.models import Role
from workspaces.testing.factories import UserFactory, make_member, make_workspace, token_for


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
    """Each test run writes artifacts and the embedded online store under its own folder."""
    yield
    import shutil

    from django.conf import settings

    shutil.rmtree(settings.TEST_STATE_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_feature_stores(settings):
    """Offline files and online rows are keyed by database ids, which a rolled-back test database
    hands out again; start every test with empty stores."""
    import shutil

    shutil.rmtree(settings.ARTIFACT_ROOT, ignore_errors=True)
    yield
    from features import online_store

    store = online_store.get_online_store()
    if isinstance(store, online_store.RedisOnlineStore):
        keys = list(store.client.scan_iter(match=f"{store.prefix}:*", count=1000))
        if keys:
            store.client.delete(*keys)
    else:
        connection = store._connection()
        connection.execute("DELETE FROM online_row")
        connection.execute("DELETE FROM online_coverage")
