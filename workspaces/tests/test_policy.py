"""The per-workspace fair-use policy: platform defaults, a workspace's own values, changes only
by platform admins in the admin console (each one an event)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from workspaces.models import POLICY_DEFAULTS, Event, WorkspacePolicy
from workspaces.selectors import Policy, PolicyLimitExceeded, policy_check, workspace_policy
from workspaces.services import workspace_policy_set
from workspaces.testing.factories import UserFactory

pytestmark = pytest.mark.django_db
ADD = "/admin/workspaces/workspacepolicy/add/"


def test_a_workspace_without_its_own_policy_gets_the_platform_defaults(workspace):
    assert workspace_policy(workspace) == Policy(**POLICY_DEFAULTS)


def test_settings_override_the_defaults_and_a_workspace_its_own_fields(workspace, settings):
    settings.WORKSPACE_POLICY_DEFAULTS = {"max_batch_rows": 7}
    assert workspace_policy(workspace).max_batch_rows == 7
    workspace_policy_set(actor=None, workspace=workspace, max_job_wall_s=60)
    policy = workspace_policy(workspace.pk)
    assert (policy.max_job_wall_s, policy.max_batch_rows) == (60, 7)
    event = Event.objects.for_workspace(workspace).get(verb="workspace.policy.changed")
    assert event.payload["after"]["max_job_wall_s"] == 60


def test_policy_check_names_the_field_and_the_limit(workspace):
    workspace_policy_set(actor=None, workspace=workspace, max_batch_rows=10)
    policy_check(workspace=workspace, limit_name="max_batch_rows", attr="rows", asked=10)
    with pytest.raises(PolicyLimitExceeded) as raised:
        policy_check(workspace=workspace, limit_name="max_batch_rows", attr="rows", asked=11)
    assert raised.value.status_code == 413
    assert "rows" in str(raised.value.detail) and "max_batch_rows = 10" in str(raised.value.detail)


def test_a_superuser_sets_a_policy_in_the_admin_with_an_event(client, workspace):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    response = client.post(ADD, {"workspace": workspace.pk, "max_lineage_datasets": 5})
    assert response.status_code == 302, response.content[:2000]
    assert workspace_policy(workspace).max_lineage_datasets == 5
    event = Event.objects.for_workspace(workspace).get(verb="workspace.policy.changed")
    assert event.actor_name == response.wsgi_request.user.username


def test_staff_who_are_no_superusers_cannot_change_a_policy(client, workspace):
    staff = UserFactory(is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__endswith="workspacepolicy"))
    client.force_login(staff)
    response = client.post(ADD, {"workspace": workspace.pk, "max_lineage_datasets": 5000000})
    assert response.status_code == 403
    assert not WorkspacePolicy.objects.for_workspace(workspace).exists()
    assert not Event.objects.for_workspace(workspace).filter(verb__startswith="workspace.policy")
