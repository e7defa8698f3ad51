from __future__ import annotations

import pytest

from config.celery import app as celery_app


@pytest.fixture
def eager_celery():
    """Tasks sent with .apply_async() run at once in this process; pair with
    ``django_capture_on_commit_callbacks(execute=True)`` for the ones sent on commit."""
    before = (celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates)
    celery_app.conf.task_always_eager = celery_app.conf.task_eager_propagates = True
    yield
    celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = before
