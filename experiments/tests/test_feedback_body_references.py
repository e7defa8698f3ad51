"""Feedback names the gateway's request ids: one served by another workspace is matched only
against the caller's own prediction log, so it is unmatched exactly like an unknown id, joins
nothing of the other workspace and writes nothing there."""

import pytest

from experiments.models import FeedbackEvent
from experiments.tests.factories import log_predictions, make_deployment
from workspaces.models import Role
from workspaces.services import membership_grant
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db


def test_another_workspaces_request_id_is_unmatched_like_an_unknown_one(
    workspace, other_workspace, client_for
):
    admin = make_member(workspace, Role.ADMIN)
    membership_grant(actor=None, workspace=other_workspace, user=admin, role=Role.ADMIN)
    dep, _ = make_deployment(other_workspace)
    [(theirs, unit, _arm)] = log_predictions(
        other_workspace, dep, lambda unit: (dep.version_id, "", ""), ["u-theirs"]
    )
    client = client_for(admin)

    def feedback(slug, request_id, event_id):
        events = [{"request_id": request_id, "event_id": event_id, "clicks": 1}]
        return client.post(
            f"/api/v1/workspaces/{slug}/feedback/", {"events": events}, format="json"
        )

    response = feedback(workspace.slug, theirs, "e-theirs")
    unknown = feedback(workspace.slug, "never-served", "e-unknown")
    assert response.status_code == unknown.status_code == 200
    assert (
        response.json()
        == unknown.json()
        == {
            "received": 1,
            "accepted": 1,
            "duplicates": 0,
            "unmatched": 1,
        }
    )
    stored = FeedbackEvent.objects.for_workspace(workspace).get(event_id="e-theirs")
    assert (stored.unit_id, stored.experiment_id, stored.arm) == ("", None, "")
    assert not FeedbackEvent.objects.for_workspace(other_workspace).exists()
    # The control: in its own workspace the same request id is matched to its unit.
    assert feedback(other_workspace.slug, theirs, "e-own").json()["unmatched"] == 0
    assert FeedbackEvent.objects.for_workspace(other_workspace).get().unit_id == unit
