"""Write rate limits: over ``workspace_write`` a user's writes in a workspace answer 429 in the
error envelope (nothing written), other workspaces and reads are unaffected."""

from __future__ import annotations

import uuid

import pytest
from django.core.cache import cache

from workspaces.models import Event, Role
from workspaces.services import membership_grant
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db
LINEAGE = "/api/v1/lineage"


@pytest.fixture
def three_writes_a_minute(settings):
    rest = dict(settings.REST_FRAMEWORK)
    rest["DEFAULT_THROTTLE_RATES"] = {**rest["DEFAULT_THROTTLE_RATES"], "workspace_write": "3/min"}
    settings.REST_FRAMEWORK = rest


def _event(namespace: str) -> dict:
    return {
        "eventType": "COMPLETE",
        "eventTime": "2026-11-01T00:00:00Z",
        "run": {"runId": str(uuid.uuid4())},
        "job": {"namespace": namespace, "name": "job"},
        "producer": "https://example.com",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "inputs": [],
        "outputs": [{"namespace": namespace, "name": "out"}],
    }


def test_writes_over_the_rate_answer_429_in_the_envelope(
    three_writes_a_minute, workspace, other_workspace, client_for
):
    admin = make_member(workspace, Role.ADMIN)
    membership_grant(actor=None, workspace=other_workspace, user=admin, role=Role.ADMIN)
    _forget(admin, workspace.slug, other_workspace.slug)
    client = client_for(admin)
    webhooks = f"/api/v1/workspaces/{workspace.slug}/webhooks/"
    queue = f"/api/v1/workspaces/{workspace.slug}/scheduler/quota-requests/"
    # Three writes pass the throttle (what they answer otherwise does not matter) ...
    for _ in range(3):
        assert client.post(webhooks, {"url": "ftp://x"}).status_code != 429
    # ... the fourth is refused before the view runs.
    before = Event.objects.unscoped().count()
    refused = client.post(queue, {"gpu_milli": 1000}, format="json")
    assert refused.status_code == 429, refused.content
    body = refused.json()
    assert (body["type"], body["code"]) == ("throttled", "throttled")
    assert set(body) >= {"type", "code", "detail", "attr"}
    assert int(refused.headers["Retry-After"]) > 0
    assert Event.objects.unscoped().count() == before
    # Reads are not throttled; another workspace has its own bucket.
    assert client.get(webhooks).status_code == 200
    other = f"/api/v1/workspaces/{other_workspace.slug}/scheduler/quota-requests/"
    assert client.post(other, {"gpu_milli": 1000}, format="json").status_code == 201


def _forget(user, *slugs: str) -> None:
    """Drop earlier requests of the same user id (ids come back after a test's rollback)."""
    for slug in slugs:
        cache.delete(f"throttle:workspace_write:{user.pk}:{slug}")


def test_the_openlineage_intake_is_throttled_per_user(three_writes_a_minute, workspace, client_for):
    developer = make_member(workspace, Role.DEVELOPER)
    _forget(developer, "")
    client = client_for(developer)
    answers = [
        client.post(LINEAGE, _event(workspace.slug), format="json").status_code for _ in "1234"
    ]
    assert answers == [201, 201, 201, 429]
    assert Event.objects.for_workspace(workspace).filter(verb__startswith="lineage.").count() == 3
