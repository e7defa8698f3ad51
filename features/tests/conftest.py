"""Fixtures shared by the features app's tests."""

from __future__ import annotations

import json

import pytest

from config.celery import app as celery_app
from features import ingestion
from features.tests.factories import make_group, user_row
from workspaces.models import Role
from workspaces.testing.factories import make_member

# The features of the ``profile`` group, in the order the lookup tests ask for them.
FEATURES = ["profile:age", "profile:city", "profile:emb", "profile:is_new"]


@pytest.fixture
def producer(workspace):
    """A developer of ``workspace``: the member who pushes in the ingestion tests."""
    return make_member(workspace, Role.DEVELOPER)


@pytest.fixture
def group(workspace, producer):
    """An empty user group ``user_profile`` (the factory's features), made by ``producer``."""
    return make_group(workspace, actor=producer, name="user_profile")


@pytest.fixture
def profile(workspace):
    """A user group ``profile`` with five users pushed (online and offline)."""
    group = make_group(workspace, name="profile")
    developer = make_member(workspace, Role.DEVELOPER)
    rows = [user_row(i) for i in range(5)]
    ingestion.batch_ingest(
        actor=developer, group=group, body=json.dumps({"rows": rows}).encode(), format="json"
    )
    return group


@pytest.fixture
def eager_celery():
    """Tasks enqueued with .delay()/.apply_async() run at once in this process (no broker, no
    worker); pair with ``django_capture_on_commit_callbacks(execute=True)`` for on-commit ones."""
    before = (celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates)
    celery_app.conf.task_always_eager = celery_app.conf.task_eager_propagates = True
    yield
    celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = before
