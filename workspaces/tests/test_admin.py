"""The admin console writes through the services (with events) and cannot change events."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from workspaces import services
from workspaces.models import Event, Membership, Workspace, WorkspaceQuota
from workspaces.testing.factories import UserFactory, make_member


@pytest.fixture
def staff_client(client, db):
    admin = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(admin)
    return client


def test_admin_creates_a_workspace_through_the_service(staff_client):
    response = staff_client.post(
        "/admin/workspaces/workspace/add/",
        {
            "slug": "video-recall",
            "name": "Video recall",
            "scene": "video",
            "prediction_type": "recall",
            "description": "",
            "template": '{"sample_stream": {"features": []}}',
        },
    )
    assert response.status_code == 302, response.content[:2000]
    workspace = Workspace.objects.get(slug="video-recall")
    # No quota was given: none is created (unlimited, as admission treats a workspace without one).
    assert not WorkspaceQuota.objects.for_workspace(workspace).exists()
    event = Event.objects.for_workspace(workspace).get()
    assert event.verb == "workspace.created"
    assert event.actor_name == response.wsgi_request.user.username


def test_admin_quota_change_is_recorded(staff_client, workspace):
    quota = services.quota_set(actor=None, workspace=workspace, gpu_milli=0, storage_gb=100)
    response = staff_client.post(
        f"/admin/workspaces/workspacequota/{quota.pk}/change/",
        {"cpu_milli": "64000", "memory_mb": "262144", "gpu_milli": "8000", "storage_gb": "500"},
    )
    assert response.status_code == 302, response.content[:2000]
    quota.refresh_from_db()
    assert (quota.cpu_milli, quota.gpu_milli, quota.storage_gb) == (64000, 8000, 500)
    event = Event.objects.for_workspace(workspace).filter(verb="quota.changed").latest("id")
    assert event.actor_name == response.wsgi_request.user.username
    assert event.payload["after"]["gpu_milli"] == 8000
    assert event.payload["before"] == {
        "cpu_milli": None,
        "memory_mb": None,
        "gpu_milli": 0,
        "storage_gb": 100,
    }


def test_workspace_page_saves_its_quota_and_grants_roles_through_the_services(
    staff_client, workspace
):
    quota = services.quota_set(actor=None, workspace=workspace, cpu_milli=16000)
    member = make_member(workspace, "viewer")
    newcomer = UserFactory()
    existing = Membership.objects.for_workspace(workspace).get(user=member)
    response = staff_client.post(
        f"/admin/workspaces/workspace/{workspace.pk}/change/",
        {
            "name": workspace.name,
            "description": "",
            "template": '{"sample_stream": {"features": []}}',
            "quotas-TOTAL_FORMS": "2",
            "quotas-INITIAL_FORMS": "1",
            "quotas-0-id": str(quota.pk),
            "quotas-0-workspace": str(workspace.pk),
            "quotas-0-cpu_milli": "16000",
            "quotas-0-memory_mb": "",
            "quotas-0-gpu_milli": "4000",
            "quotas-0-storage_gb": "100",
            "quotas-1-workspace": str(workspace.pk),
            "quotas-1-gpu_type": "A100",
            "quotas-1-cpu_milli": "",
            "quotas-1-memory_mb": "",
            "quotas-1-gpu_milli": "2000",
            "quotas-1-storage_gb": "",
            "memberships-TOTAL_FORMS": "2",
            "memberships-INITIAL_FORMS": "1",
            "memberships-0-id": str(existing.pk),
            "memberships-0-workspace": str(workspace.pk),
            "memberships-0-role": "developer",
            "memberships-1-workspace": str(workspace.pk),
            "memberships-1-user": str(newcomer.pk),
            "memberships-1-role": "maintainer",
        },
    )
    assert response.status_code == 302, response.content[:3000]
    quota.refresh_from_db()
    assert (quota.cpu_milli, quota.gpu_milli, quota.storage_gb) == (16000, 4000, 100)
    assert WorkspaceQuota.objects.for_workspace(workspace).get(gpu_type="A100").gpu_milli == 2000
    roles = dict(Membership.objects.for_workspace(workspace).values_list("user__username", "role"))
    assert roles == {member.username: "developer", newcomer.username: "maintainer"}
    verbs = set(Event.objects.for_workspace(workspace).values_list("verb", flat=True))
    assert {"quota.changed", "membership.granted", "membership.changed"} <= verbs


def test_events_are_view_only_in_the_admin(staff_client, workspace):
    event = Event.objects.for_workspace(workspace).get()
    page = staff_client.get(f"/admin/workspaces/event/{event.pk}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert (
        staff_client.post(
            f"/admin/workspaces/event/{event.pk}/change/", {"verb": "forged"}
        ).status_code
        == 403
    )
    assert (
        staff_client.post(
            f"/admin/workspaces/event/{event.pk}/delete/", {"post": "yes"}
        ).status_code
        == 403
    )
    assert staff_client.get("/admin/workspaces/event/add/").status_code == 403
    listing = staff_client.get("/admin/workspaces/event/", {"workspace__id__exact": workspace.pk})
    assert listing.status_code == 200
    assert b"workspace.created" in listing.content
    assert Event.objects.unscoped().get(pk=event.pk).verb == "workspace.created"


def test_events_cannot_be_written_through_the_api(client_for, workspace, members):
    client = client_for(members["admin"])
    url = f"/api/v1/workspaces/{workspace.slug}/activity/"
    event = Event.objects.for_workspace(workspace).first()
    # Refused before dispatch (no role may write here), so 403 rather than 405.
    assert client.post(url, {"verb": "forged"}, format="json").status_code == 403
    assert client.delete(f"{url}{event.pk}/").status_code == 404
    assert client.put(f"{url}{event.pk}/", {"verb": "x"}, format="json").status_code == 404
    assert Event.objects.unscoped().get(pk=event.pk).verb == event.verb


def test_workspaces_cannot_be_deleted_in_the_admin(staff_client, workspace):
    response = staff_client.post(
        f"/admin/workspaces/workspace/{workspace.pk}/delete/", {"post": "yes"}
    )
    assert response.status_code == 403
    assert Workspace.objects.filter(pk=workspace.pk).exists()


def test_demo_admin_sees_both_demo_workspaces(client, db):
    call_command("demo_setup", stdout=StringIO())
    assert client.login(username="admin", password="admin")
    response = client.get("/")
    assert response.status_code == 302
    dashboard = client.get(response["Location"])
    options = dashboard.content.decode()
    assert "Feed pCTR" in options and "Search pCVR" in options
    api = client.get("/api/v1/workspaces/").json()
    assert sorted(w["slug"] for w in api) == ["feed-pctr", "search-pcvr"]
    assert {w["role"] for w in api} == {"admin"}
