"""Quota changes only by platform admins: workspace admins get 403 and file a quota request,
which a superuser approves (the quota is set, with events) or rejects in the admin console."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied

from training.scheduler import services
from training.scheduler.models import WorkspaceQuota
from workspaces.models import Event, QuotaRequest, Role
from workspaces.testing.factories import UserFactory

pytestmark = pytest.mark.django_db
QUOTA = {"gpu_type": "", "cpu_milli": 1000, "memory_mb": 1024, "gpu_milli": 10_000_000}


def _base(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.slug}/scheduler"


@pytest.fixture
def superuser():
    return UserFactory(is_staff=True, is_superuser=True)


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
@pytest.mark.parametrize("role", [Role.ADMIN, Role.MAINTAINER, Role.DEVELOPER])
def test_workspace_members_cannot_change_a_quota(workspace, members, client_for, method, role):
    client = client_for(members[role])
    response = getattr(client, method)(_base(workspace) + "/quotas/", QUOTA, format="json")
    assert response.status_code == 403, response.content
    assert response.json()["type"] == "permission_denied"
    assert not WorkspaceQuota.objects.for_workspace(workspace).exists()
    assert not Event.objects.for_workspace(workspace).filter(verb="quota.changed").exists()


def test_an_outsider_gets_404_and_anonymous_401(workspace, members, client_for):
    url = _base(workspace) + "/quotas/"
    assert client_for(members["outsider"]).post(url, QUOTA, format="json").status_code == 404
    assert client_for(None).post(url, QUOTA, format="json").status_code == 401


def test_a_superuser_changes_a_quota_and_the_change_is_an_event(workspace, client_for, superuser):
    response = client_for(superuser).post(_base(workspace) + "/quotas/", QUOTA, format="json")
    assert response.status_code == 201, response.content
    quota = WorkspaceQuota.objects.for_workspace(workspace).get(gpu_type="")
    assert quota.gpu_milli == QUOTA["gpu_milli"]
    event = Event.objects.for_workspace(workspace).get(verb="quota.changed")
    assert event.actor_id == superuser.pk
    assert event.payload["after"]["gpu_milli"] == QUOTA["gpu_milli"]


def test_the_service_refuses_a_workspace_admin_too(workspace, members):
    with pytest.raises(PermissionDenied):
        services.quota_set(actor=members[Role.ADMIN], workspace=workspace, gpu_milli=1)
    assert not WorkspaceQuota.objects.for_workspace(workspace).exists()


def test_a_workspace_admin_requests_and_a_superuser_approves_in_the_admin(
    workspace, members, client_for, client, superuser
):
    admin = client_for(members[Role.ADMIN])
    url = _base(workspace) + "/quota-requests/"
    body = {"gpu_type": "", "gpu_milli": 4000, "reason": "bigger experiments"}
    assert client_for(members[Role.MAINTAINER]).post(url, body, format="json").status_code == 403
    assert admin.post(url, {"reason": "nothing asked"}, format="json").status_code == 400
    filed = admin.post(url, body, format="json")
    assert filed.status_code == 201, filed.content
    assert filed.json()["status"] == "pending"
    assert not WorkspaceQuota.objects.for_workspace(workspace).exists()  # nothing changed yet
    assert Event.objects.for_workspace(workspace).filter(verb="quota_request.created").exists()
    assert admin.get(url).json()["results"][0]["id"] == filed.json()["id"]

    client.force_login(superuser)
    response = client.post(
        "/admin/workspaces/quotarequest/",
        {"action": "approve", "_selected_action": [filed.json()["id"]]},
    )
    assert response.status_code == 302
    assert QuotaRequest.objects.for_workspace(workspace).get().status == "approved"
    assert WorkspaceQuota.objects.for_workspace(workspace).get(gpu_type="").gpu_milli == 4000
    verbs = set(Event.objects.for_workspace(workspace).values_list("verb", flat=True))
    assert {"quota_request.approved", "quota.changed"} <= verbs


def test_staff_who_are_no_superusers_cannot_approve(workspace, members, client):
    request = QuotaRequest.objects.create(workspace=workspace, gpu_milli=9999)
    client.force_login(UserFactory(is_staff=True))
    client.post(
        "/admin/workspaces/quotarequest/",
        {"action": "approve", "_selected_action": [request.pk]},
    )
    assert QuotaRequest.objects.for_workspace(workspace).get().status == "pending"
    assert not WorkspaceQuota.objects.for_workspace(workspace).exists()
    with pytest.raises(PermissionDenied):
        services.quota_request_decide(
            actor=members[Role.ADMIN], quota_request=request, approve=True
        )


def test_a_superuser_edits_a_quota_in_the_admin_through_the_service(workspace, client, superuser):
    client.force_login(superuser)
    response = client.post(
        "/admin/workspaces/workspacequota/add/",
        {"workspace": workspace.pk, "gpu_type": "", "cpu_milli": "", "memory_mb": "",
         "gpu_milli": 3000},
    )  # fmt: skip
    assert response.status_code == 302, response.content[:2000]
    assert Event.objects.for_workspace(workspace).filter(verb="quota.changed").exists()
