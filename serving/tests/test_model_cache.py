"""The per-process model cache evicts the least recently used version, never one a routing
table routes to (issue 18: a FIFO cache could evict the hot production model)."""

from __future__ import annotations

import pytest

from serving import inference
from serving.inference import MODELS
from serving.routing import TABLES
from serving.tests.helpers import deployed
from workspaces.models import Role

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_caches():
    MODELS.clear()
    TABLES.clear()
    yield
    MODELS.clear()
    TABLES.clear()


def test_loads_beyond_the_cap_evict_least_recently_used_and_never_the_routed_version(
    workspace, members, monkeypatch
):
    _, versions, dep = deployed(workspace, members[Role.MAINTAINER], versions=4)
    production, a, b, c = (v.pk for v in versions)
    monkeypatch.setattr(inference, "MAX_LOADED", 2)
    TABLES.get(workspace.pk, dep.name)  # this process routes "main" to production
    MODELS.get(production)
    MODELS.get(a)
    MODELS.get(b)  # over the cap: a (least recent, not routed) goes, production stays
    assert MODELS.loaded_ids() == [production, b]
    MODELS.get(production)  # used again: now the most recent
    MODELS.get(c)
    assert MODELS.loaded_ids() == [production, c]
    assert MODELS.get(production).number == 1
