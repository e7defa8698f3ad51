"""API behaviour: tokens, error envelope, bad inputs (BAD-INPUTS.md), pagination, schema."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from workspaces import services
from workspaces.models import ApiToken, Event, Membership, Role, Workspace, hash_token_key
from workspaces.testing.factories import TEST_PASSWORD, UserFactory, make_member

ENVELOPE = {"type", "code", "detail", "attr"}


def members_url(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.slug}/members/"


# --- tokens -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_password_exchange_gives_a_token_whose_hash_alone_is_stored(api_client):
    user = UserFactory()
    response = api_client.post(
        "/api/v1/auth/token/", {"username": user.username, "password": TEST_PASSWORD}, format="json"
    )
    assert response.status_code == 201
    key = response.json()["token"]
    token = ApiToken.objects.get(user=user)
    assert token.key_hash == hash_token_key(key)
    assert key not in {token.key_hash, token.prefix}
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api_client.get("/api/v1/workspaces/").status_code == 200


@pytest.mark.django_db
def test_wrong_password_is_401_with_envelope(api_client):
    user = UserFactory()
    response = api_client.post(
        "/api/v1/auth/token/", {"username": user.username, "password": "nope"}, format="json"
    )
    assert response.status_code == 401
    assert set(response.json()) >= ENVELOPE
    assert not ApiToken.objects.filter(user=user).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["revoked", "expired", "inactive-user", "garbage"])
def test_dead_tokens_are_refused(state, api_client, workspace, members):
    user = members["viewer"]
    token, key = services.api_token_create(actor=None, user=user, name="t")
    if state == "revoked":
        services.api_token_revoke(actor=None, token=token)
    elif state == "expired":
        ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(1))
    elif state == "inactive-user":
        type(user).objects.filter(pk=user.pk).update(is_active=False)
    else:
        key = key[:-2] + "xx"
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    response = api_client.get(f"/api/v1/workspaces/{workspace.slug}/")
    assert response.status_code == 401
    assert response.json()["type"] == "authentication_error"


@pytest.mark.django_db
def test_identity_headers_are_ignored(api_client, workspace, members):
    admin = members["admin"]
    for header in ("HTTP_X_USER", "HTTP_X_FORWARDED_USER", "HTTP_REMOTE_USER", "REMOTE_USER"):
        response = api_client.get(
            f"/api/v1/workspaces/{workspace.slug}/", **{header: admin.username}
        )
        assert response.status_code == 401, header


@pytest.mark.django_db
def test_token_scope_cannot_name_an_invisible_workspace(
    client_for, workspace, other_workspace, members
):
    client = client_for(members["developer"])
    response = client.post(
        "/api/v1/auth/tokens/", {"name": "x", "workspaces": [other_workspace.slug]}, format="json"
    )
    assert response.status_code == 404
    assert response.json()["attr"] == "workspaces"
    missing = client.post(
        "/api/v1/auth/tokens/", {"name": "x", "workspaces": ["no-such-ws"]}, format="json"
    )
    assert missing.status_code == 404
    assert missing.json() == {
        **response.json(),
        "detail": response.json()["detail"].replace(other_workspace.slug, "no-such-ws"),
    }
    assert ApiToken.objects.filter(user=members["developer"], name="x").count() == 0


@pytest.mark.django_db
def test_narrowed_token_mints_only_narrowed_tokens(client_for, workspace, other_workspace):
    user = make_member(workspace, Role.DEVELOPER)
    services.membership_grant(actor=None, workspace=other_workspace, user=user, role=Role.VIEWER)
    client = client_for(user, workspaces=[workspace])
    response = client.post("/api/v1/auth/tokens/", {"name": "child"}, format="json")
    assert response.status_code == 201
    assert response.json()["workspaces"] == [workspace.slug]


@pytest.mark.django_db
def test_another_users_token_cannot_be_revoked(client_for, members):
    victim_token, _ = services.api_token_create(actor=None, user=members["admin"], name="v")
    response = client_for(members["viewer"]).delete(f"/api/v1/auth/tokens/{victim_token.pk}/")
    assert response.status_code == 404
    victim_token.refresh_from_db()
    assert victim_token.revoked_at is None


# --- workspace-scoped behaviour ----------------------------------------------------------------


@pytest.mark.django_db
def test_workspace_detail_shows_quota_usage_and_the_callers_role(client_for, workspace, members):
    body = client_for(members["maintainer"]).get(f"/api/v1/workspaces/{workspace.slug}/").json()
    assert body["role"] == "maintainer"
    assert body["quota"]["limited"] is False  # created without a quota
    assert (body["quota"]["rows"], body["quota"]["used_cpu_milli"]) == ([], 0)
    assert (body["scene"], body["prediction_type"]) == (workspace.scene, workspace.prediction_type)


@pytest.mark.django_db
def test_list_never_shows_another_workspaces_rows(client_for, workspace, other_workspace, members):
    make_member(other_workspace, Role.VIEWER)
    client = client_for(members["admin"])
    slugs = [w["slug"] for w in client.get("/api/v1/workspaces/").json()]
    assert slugs == [workspace.slug]
    usernames = {m["username"] for m in client.get(members_url(workspace)).json()["results"]}
    assert usernames == {members[r].username for r in Role.values}
    events = client.get(f"/api/v1/workspaces/{workspace.slug}/activity/?limit=500").json()
    refs = {ref["label"] for e in events["results"] for ref in e["refs"]}
    assert other_workspace.slug not in refs


@pytest.mark.django_db
def test_mass_assignment_is_ignored(client_for, workspace, other_workspace, members):
    client = client_for(members["admin"])
    response = client.patch(
        f"/api/v1/workspaces/{workspace.slug}/",
        {"description": "ok", "slug": "hijack", "scene": "evil", "created_by": 1, "quota": {}},
        format="json",
    )
    assert response.status_code == 200
    workspace.refresh_from_db()
    assert (workspace.slug, workspace.description) != ("hijack", "")
    assert workspace.scene != "evil"
    newcomer = UserFactory()
    response = client.post(
        members_url(workspace),
        {
            "username": newcomer.username,
            "role": "viewer",
            "workspace": other_workspace.slug,
            "is_staff": True,
        },
        format="json",
    )
    assert response.status_code == 201
    assert Membership.objects.for_workspace(workspace).filter(user=newcomer).exists()
    assert not Membership.objects.for_workspace(other_workspace).filter(user=newcomer).exists()
    newcomer.refresh_from_db()
    assert not newcomer.is_staff


@pytest.mark.django_db
def test_bad_role_names_the_field_and_writes_nothing(client_for, workspace, members):
    before = Event.objects.for_workspace(workspace).count()
    response = client_for(members["admin"]).post(
        members_url(workspace), {"username": UserFactory().username, "role": "god"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["attr"] == "role"
    assert response.json()["type"] == "validation_error"
    assert Event.objects.for_workspace(workspace).count() == before


@pytest.mark.django_db
def test_removing_the_last_admin_is_409(client_for, workspace):
    admin = make_member(workspace, Role.ADMIN)
    response = client_for(admin).delete(f"{members_url(workspace)}{admin.username}/")
    assert response.status_code == 409
    assert admin.username in response.json()["detail"]
    assert Membership.objects.for_workspace(workspace).filter(user=admin, role="admin").exists()


@pytest.mark.django_db
def test_role_change_moves_guardian_permissions(client_for, workspace, members):
    target = members["developer"]
    client = client_for(members["admin"])
    response = client.patch(
        f"{members_url(workspace)}{target.username}/", {"role": "viewer"}, format="json"
    )
    assert response.status_code == 200
    target = type(target).objects.get(pk=target.pk)
    assert target.has_perm("workspaces.view_workspace", workspace)
    assert not target.has_perm("workspaces.develop_in_workspace", workspace)


@pytest.mark.django_db
def test_service_account_token_reaches_only_its_workspace(
    client_for, api_client, workspace, other_workspace, members
):
    response = client_for(members["admin"]).post(
        f"/api/v1/workspaces/{workspace.slug}/service-accounts/",
        {"username": "clicks-producer", "role": "developer"},
        format="json",
    )
    assert response.status_code == 201
    key = response.json()["token"]
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert [w["slug"] for w in api_client.get("/api/v1/workspaces/").json()] == [workspace.slug]
    assert api_client.get(f"/api/v1/workspaces/{other_workspace.slug}/").status_code == 404
    # A service account cannot log in with a password.
    assert not api_client.login(username="clicks-producer", password="")


@pytest.mark.django_db
def test_activity_filters_by_verb_and_object(client_for, workspace, members):
    client = client_for(members["viewer"])
    url = f"/api/v1/workspaces/{workspace.slug}/activity/"
    verbs = {e["verb"] for e in client.get(url, {"verb": "membership."}).json()["results"]}
    assert verbs == {"membership.granted"}
    target = members["developer"]
    found = client.get(url, {"object": f"user:{target.pk}"}).json()["results"]
    assert [e["payload"]["user"] for e in found] == [target.username]
    assert client.get(url, {"object": "nonsense"}).status_code == 400


@pytest.mark.django_db
def test_pagination_is_capped(client_for, workspace, members, settings):
    for index in range(8):
        services.quota_set(actor=None, workspace=workspace, cpu_milli=index + 1)
    from workspaces.api.pagination import CappedLimitOffsetPagination

    CappedLimitOffsetPagination.max_limit, saved = 5, CappedLimitOffsetPagination.max_limit
    try:
        body = (
            client_for(members["viewer"])
            .get(f"/api/v1/workspaces/{workspace.slug}/activity/?limit=1000000")
            .json()
        )
    finally:
        CappedLimitOffsetPagination.max_limit = saved
    assert len(body["results"]) == 5
    assert body["count"] > 5
    assert "limit=5" in body["next"]


@pytest.mark.django_db
def test_list_endpoints_do_not_grow_queries_with_rows(
    client_for, workspace, members, django_assert_max_num_queries
):
    client = client_for(members["viewer"])
    for _ in range(30):
        make_member(workspace, Role.VIEWER)
    with django_assert_max_num_queries(12):
        assert client.get(members_url(workspace) + "?limit=100").status_code == 200
    with django_assert_max_num_queries(12):
        assert (
            client.get(f"/api/v1/workspaces/{workspace.slug}/activity/?limit=100").status_code
            == 200
        )


# --- bad inputs ------------------------------------------------------------------------------


BAD_JSON = {
    "nan": b'{"username": "x", "role": NaN}',
    "infinity": b'{"username": "x", "role": Infinity}',
    "huge-number": b'{"username": "x", "role": 1e999}',
    "duplicate-keys": b'{"username": "x", "role": "viewer", "role": "admin"}',
    "deep-nesting": b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "truncated": b'{"username": "x", ',
    "empty": b"",
    "not-utf8": b'{"username": "\xff\xfe"}',
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", BAD_JSON, ids=list(BAD_JSON))
def test_malformed_json_is_400_and_writes_nothing(case, client_for, workspace, members):
    before = Event.objects.unscoped().count()
    client = client_for(members["admin"])
    after_token = Event.objects.unscoped().count()
    response = client.generic(
        "POST", members_url(workspace), BAD_JSON[case], content_type="application/json"
    )
    assert response.status_code == 400, response.content[:300]
    assert set(response.json()) >= ENVELOPE
    assert Event.objects.unscoped().count() == after_token >= before


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [{"username": ["a"], "role": "viewer"}, {"username": 7, "role": {"x": 1}}, [], "text", 3],
)
def test_wrong_types_are_400_naming_a_field(body, client_for, workspace, members):
    response = client_for(members["admin"]).post(members_url(workspace), body, format="json")
    assert response.status_code == 400
    assert response.json()["type"] == "validation_error"


@pytest.mark.django_db
def test_body_over_the_limit_is_413_before_parsing(client_for, workspace, members, settings):
    settings.API_MAX_BODY_BYTES = 1024
    big = b'{"username": "' + b"a" * 2048 + b'", "role": "viewer"}'
    response = client_for(members["admin"]).generic(
        "POST", members_url(workspace), big, content_type="application/json"
    )
    assert response.status_code == 413
    assert response.json()["type"] == "too_large"


@pytest.mark.django_db
def test_50_megabyte_body_is_413(client_for, workspace, members):
    big = b"[" + b"1," * (25 * 1024 * 1024) + b"1]"
    response = client_for(members["admin"]).generic(
        "POST", members_url(workspace), big, content_type="application/json"
    )
    assert response.status_code == 413


@pytest.mark.django_db
def test_xss_in_stored_fields_comes_back_as_data_not_markup(client_for, workspace, members):
    payload = '<script>alert(1)</script><a href="javascript:alert(2)">x</a>'
    client = client_for(members["admin"])
    response = client.patch(
        f"/api/v1/workspaces/{workspace.slug}/", {"description": payload}, format="json"
    )
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json()["description"] == payload


@pytest.mark.django_db
def test_slug_with_path_tricks_is_404(client_for, members):
    client = client_for(members["admin"])
    for slug in ("..%2f..%2fetc", "%252e%252e%252f", "ws%00", "a" * 300):
        assert client.get(f"/api/v1/workspaces/{slug}/").status_code == 404


# --- schema and docs --------------------------------------------------------------------------


@pytest.mark.django_db
def test_schema_and_docs_are_served_without_a_cdn(client):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/workspaces/{ws}/members/" in schema.content
    assert b"tokenAuth" in schema.content
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "cdn." not in html and "unpkg" not in html
    assert "/static/drf_spectacular_sidecar/" in html


@pytest.mark.django_db
def test_workspace_creation_is_not_offered_to_users(client_for, members):
    response = client_for(members["admin"]).post(
        "/api/v1/workspaces/",
        {"slug": "mine", "scene": "x", "prediction_type": "pctr"},
        format="json",
    )
    assert response.status_code == 405
    assert not Workspace.objects.filter(slug="mine").exists()


@pytest.mark.django_db
def test_the_last_admin_cannot_demote_themselves(client_for, workspace):
    admin = make_member(workspace, Role.ADMIN)
    response = client_for(admin).patch(
        f"{members_url(workspace)}{admin.username}/", {"role": "viewer"}, format="json"
    )
    assert response.status_code == 409
    assert "last admin" in response.json()["detail"]
    assert Membership.objects.for_workspace(workspace).get(user=admin).role == Role.ADMIN
    second = make_member(workspace, Role.ADMIN)
    response = client_for(second).patch(
        f"{members_url(workspace)}{admin.username}/", {"role": "viewer"}, format="json"
    )
    assert response.status_code == 200
