"""The admin CLI: workspace create/grant/revoke/quota, token create/revoke, demo_setup."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from workspaces.models import (
    ApiToken,
    Event,
    Membership,
    Workspace,
    WorkspaceQuota,
    hash_token_key,
)
from workspaces.testing.factories import UserFactory


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_workspace_create_grant_and_quota():
    user = UserFactory(username="carol")
    run(
        "workspace",
        "create",
        "feed-pctr",
        "--scene",
        "feed",
        "--prediction-type",
        "pctr",
        "--gpus",
        "4",
    )
    workspace = Workspace.objects.get(slug="feed-pctr")
    assert (workspace.scene, workspace.prediction_type) == ("feed", "pctr")
    assert WorkspaceQuota.objects.for_workspace(workspace).get(gpu_type="").gpu_milli == 4000

    run("workspace", "grant", "feed-pctr", "carol", "maintainer")
    assert Membership.objects.for_workspace(workspace).get(user=user).role == "maintainer"
    assert user.has_perm("workspaces.release_in_workspace", workspace)
    assert not user.has_perm("workspaces.administer_workspace", workspace)

    run("workspace", "quota", "feed-pctr", "--cpu-cores", "32")
    quota = WorkspaceQuota.objects.for_workspace(workspace).get(gpu_type="")
    assert (quota.cpu_milli, quota.gpu_milli) == (32000, 4000)  # the GPU limit stays as set
    verbs = list(
        Event.objects.for_workspace(workspace).order_by("id").values_list("verb", flat=True)
    )
    assert verbs == ["workspace.created", "quota.changed", "membership.granted", "quota.changed"]

    run("workspace", "revoke", "feed-pctr", "carol")
    assert not Membership.objects.for_workspace(workspace).filter(user=user).exists()
    user = type(user).objects.get(pk=user.pk)  # drop guardian's permission cache
    assert not user.has_perm("workspaces.view_workspace", workspace)


@pytest.mark.django_db
def test_workspace_create_refuses_duplicates_and_bad_input():
    run("workspace", "create", "a", "--scene", "feed", "--prediction-type", "pctr")
    with pytest.raises(CommandError, match="already exists"):
        run("workspace", "create", "a", "--scene", "other", "--prediction-type", "pctr")
    with pytest.raises(CommandError, match="already has"):
        run("workspace", "create", "b", "--scene", "feed", "--prediction-type", "pctr")
    with pytest.raises(CommandError, match="slug"):
        run("workspace", "create", "Bad Slug!", "--scene", "x", "--prediction-type", "pctr")
    with pytest.raises(CommandError, match="no user"):
        run("workspace", "grant", "a", "nobody", "viewer")
    assert list(Workspace.objects.values_list("slug", flat=True)) == ["a"]


@pytest.mark.django_db
def test_token_create_prints_a_working_key_limited_to_a_workspace(workspace, members, client):
    user = members["developer"]
    key = run("token", "create", user.username, "--workspace", workspace.slug).strip()
    token = ApiToken.objects.get(key_hash=hash_token_key(key))
    assert token.user == user
    assert list(token.workspaces.all()) == [workspace]
    response = client.get("/api/v1/workspaces/", HTTP_AUTHORIZATION=f"Token {key}")
    assert [w["slug"] for w in response.json()] == [workspace.slug]

    run("token", "revoke", token.prefix)
    response = client.get("/api/v1/workspaces/", HTTP_AUTHORIZATION=f"Token {key}")
    assert response.status_code == 401


@pytest.mark.django_db
def test_token_cannot_be_limited_to_a_workspace_the_user_is_not_in(workspace, other_workspace):
    user = UserFactory()
    with pytest.raises(CommandError, match="not a member"):
        run("token", "create", user.username, "--workspace", other_workspace.slug)
    assert not ApiToken.objects.filter(user=user).exists()


@pytest.mark.django_db
def test_demo_setup_is_idempotent_and_gives_the_admin_both_workspaces():
    first = run("demo_setup")
    assert "admin / admin" in first
    assert "producer token" in first
    events = Event.objects.unscoped().count()
    second = run("demo_setup")
    assert "producer token" not in second
    assert Event.objects.unscoped().count() == events
    slugs = sorted(Workspace.objects.values_list("slug", flat=True))
    assert slugs == ["feed-pctr", "search-pcvr"]


@pytest.mark.django_db
def test_demo_setup_refuses_outside_demo_mode(settings):
    settings.DEMO_MODE = False
    with pytest.raises(CommandError, match="demo mode"):
        run("demo_setup")
    assert not Workspace.objects.exists()
