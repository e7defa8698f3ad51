"""The hot-path caches never outlive a change of who may do what."""

from __future__ import annotations

from django.core.cache import cache

from workspaces import access_cache, services
from workspaces.models import Role
from workspaces.testing.factories import make_member


def detail(client, workspace):
    return client.get(f"/api/v1/workspaces/{workspace.slug}/")


def members_url(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.slug}/members/"


def test_revoked_token_fails_on_the_next_request(api_client, workspace):
    user = make_member(workspace, Role.VIEWER)
    token, key = services.api_token_create(actor=None, user=user, name="t")
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert detail(api_client, workspace).status_code == 200  # now cached
    services.api_token_revoke(actor=None, token=token)
    assert detail(api_client, workspace).status_code == 401


def test_removed_member_gets_404_on_the_next_request(client_for, workspace):
    user = make_member(workspace, Role.VIEWER)
    make_member(workspace, Role.ADMIN)
    client = client_for(user)
    assert detail(client, workspace).status_code == 200
    services.membership_revoke(actor=None, workspace=workspace, user=user)
    assert detail(client, workspace).status_code == 404


def test_demoted_admin_cannot_write_on_the_next_request(client_for, workspace):
    admin = make_member(workspace, Role.ADMIN)
    make_member(workspace, Role.ADMIN)
    client = client_for(admin)
    assert client.get(members_url(workspace)).status_code == 200
    services.membership_grant(actor=None, workspace=workspace, user=admin, role=Role.VIEWER)
    other = make_member(workspace, Role.VIEWER)
    response = client.patch(
        f"{members_url(workspace)}{other.username}/", {"role": "admin"}, format="json"
    )
    assert response.status_code == 403


def test_deactivated_user_is_refused(client_for, workspace):
    user = make_member(workspace, Role.VIEWER)
    client = client_for(user)
    assert detail(client, workspace).status_code == 200
    user.is_active = False
    user.save()
    assert detail(client, workspace).status_code == 401


def test_token_narrowed_after_use_is_narrowed_at_once(api_client, workspace, other_workspace):
    user = make_member(workspace, Role.VIEWER)
    services.membership_grant(actor=None, workspace=other_workspace, user=user, role=Role.VIEWER)
    token, key = services.api_token_create(actor=None, user=user, name="t")
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert detail(api_client, workspace).status_code == 200
    token.workspaces.set([other_workspace])
    assert detail(api_client, workspace).status_code == 404
    assert detail(api_client, other_workspace).status_code == 200


def test_a_new_generation_from_another_process_drops_this_process_entries(client_for, workspace):
    user = make_member(workspace, Role.VIEWER)
    client = client_for(user)
    assert detail(client, workspace).status_code == 200
    # Another process changed access and published a new generation; this process still holds
    # an entry that would now be wrong (simulated by planting a bogus value).
    with access_cache._lock:
        for key in list(access_cache._entries):
            if key[0] == "workspace-access":
                access_cache._entries[key] = None
    assert detail(client, workspace).status_code == 404  # the planted entry is served...
    cache.set(access_cache.GENERATION_KEY, "published-by-another-process", timeout=None)
    assert detail(client, workspace).status_code == 200  # ...until the generation moves


def test_invalidation_publishes_a_new_generation_on_commit(
    workspace, django_capture_on_commit_callbacks
):
    before = access_cache.current_generation()
    with django_capture_on_commit_callbacks(execute=True):
        make_member(workspace, Role.VIEWER)
    assert access_cache.current_generation() != before


def test_hot_path_runs_no_queries_once_warm(client_for, workspace, django_assert_num_queries):
    client = client_for(make_member(workspace, Role.VIEWER))
    assert detail(client, workspace).status_code == 200
    # The body's own reads (the caller's role; the quota summary: its rows, the holding jobs,
    # the stored bytes); none for auth, access or the workspace itself.
    with django_assert_num_queries(4):
        assert detail(client, workspace).status_code == 200


def test_a_login_stamp_leaves_the_generation_alone(workspace, django_capture_on_commit_callbacks):
    from django.contrib.auth.models import update_last_login

    user = make_member(workspace, Role.VIEWER)
    before = access_cache.current_generation()
    with django_capture_on_commit_callbacks(execute=True):
        update_last_login(None, user)
    assert access_cache.current_generation() == before
    with django_capture_on_commit_callbacks(execute=True):
        user.is_active = False
        user.save(update_fields=["is_active", "last_login"])
    assert access_cache.current_generation() != before
