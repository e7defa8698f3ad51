"""The online lookup's fast path answers exactly like the DRF view, and steps aside otherwise."""

from __future__ import annotations

import json
import uuid

import pytest
from django.core.cache import cache
from django.utils import timezone

from features import fastpath, online_store
from features.tests.conftest import FEATURES
from workspaces import access_cache, services
from workspaces.models import ApiToken, Role
from workspaces.testing.factories import make_member, token_for


def url(workspace, query: str = "") -> str:
    return f"/api/v1/workspaces/{workspace.slug}/online-features/{query}"


def post(client, workspace, body, *, query: str = "", raw: bool = False, **headers):
    data = body if raw else json.dumps(body)
    headers.setdefault("HTTP_X_REQUEST_ID", "compare-1")  # the same id on both paths
    return client.generic(
        "POST", url(workspace, query), data, content_type="application/json", **headers
    )


def served_by_fastpath(client, workspace, body, **kwargs):
    before = fastpath.served
    response = post(client, workspace, body, **kwargs)
    return response, fastpath.served - before


def test_a_warm_lookup_takes_the_fast_path_with_the_slow_paths_answer(
    client_for, workspace, profile
):
    client = client_for(make_member(workspace, Role.VIEWER))
    body = {"entities": ["u1", "u3", "nobody", "u1"], "features": FEATURES}

    slow, fast_count = served_by_fastpath(client, workspace, body, query="?via=drf")
    assert fast_count == 0  # a query string is left to DRF
    first, _ = served_by_fastpath(client, workspace, body)
    again, fast_count = served_by_fastpath(client, workspace, body)

    assert fast_count == 1
    for response in (first, again):
        assert response.status_code == slow.status_code == 200
        assert response.content == slow.content
        assert dict(response.headers) == dict(slow.headers)
    assert again.json() == {
        "features": FEATURES,
        "rows": [
            [21, "c1", [0.5, 1.5, 1.0], False],
            [23, "c0", [0.5, 1.5, 3.0], False],
            [None, None, None, None],
            [21, "c1", [0.5, 1.5, 1.0], False],
        ],
    }


def test_composite_entities_and_pinned_versions_take_the_fast_path(client_for, workspace, profile):
    client = client_for(make_member(workspace, Role.VIEWER))
    body = {"entities": [{"user_id": "u2"}, "u4"], "features": ["profile@v1:age", "profile:age"]}
    post(client, workspace, body)
    response, fast_count = served_by_fastpath(client, workspace, body)
    assert fast_count == 1
    assert response.json() == {
        "features": ["profile@v1:age", "profile:age"],
        "rows": [[22, 22], [24, 24]],
    }


@pytest.mark.parametrize(
    ("body", "status", "attr"),
    [
        ({"entities": ["u1"], "features": ["profile:nope"]}, 404, "features.0"),
        ({"entities": ["u1"], "features": ["profile:age", "nogroup:x"]}, 404, "features.1"),
        ({"entities": [], "features": FEATURES}, 400, "entities"),
        ({"entities": [True], "features": FEATURES}, 400, "entities.0"),
        ({"entities": [{"id": "u1"}], "features": FEATURES}, 400, "entities.0"),
        ({"entities": ["u1"], "features": "profile:age"}, 400, "features"),
        ({"entities": ["u1"]}, 400, "features"),
    ],
)
def test_bad_requests_answer_the_slow_paths_error_naming_the_field(
    client_for, workspace, profile, body, status, attr
):
    """Bad input is the slow path's 400 and an unknown feature its 404, both naming the field."""
    client = client_for(make_member(workspace, Role.VIEWER))
    post(client, workspace, {"entities": ["u1"], "features": FEATURES})  # warm
    response, fast_count = served_by_fastpath(client, workspace, body)
    assert fast_count == 0
    assert response.status_code == status
    assert response.json()["attr"] == attr


@pytest.mark.parametrize(
    "raw",
    [
        '{"entities": ["u1"], "features": ["profile:age"], "features": ["profile:city"]}',
        '{"entities": ["u1"], "features": ["profile:age"], "feat\\u0075res": ["profile:city"]}',
        '{"entities": ["u1"], "features": ["profile:age"], "x": 1, "x": 2}',
        '{"entities": [1e999], "features": ["profile:age"]}',
        '{"entities": ["u1"], "features": ["profile:age"]',
        "",
    ],
)
def test_bodies_the_strict_parser_refuses_answer_400(client_for, workspace, profile, raw):
    client = client_for(make_member(workspace, Role.VIEWER))
    post(client, workspace, {"entities": ["u1"], "features": ["profile:age"]})  # warm
    response, fast_count = served_by_fastpath(client, workspace, raw, raw=True)
    assert fast_count == 0
    assert response.status_code == 400
    assert response.json()["type"] == "validation_error"


def test_a_revoked_token_is_refused_at_once(client_for, workspace, profile):
    viewer = make_member(workspace, Role.VIEWER)
    key = token_for(viewer)
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    body = {"entities": ["u1"], "features": FEATURES}
    post(client, workspace, body)
    assert served_by_fastpath(client, workspace, body)[1] == 1

    token = ApiToken.objects.get(user=viewer)
    token.revoked_at = timezone.now()
    token.save()

    response, fast_count = served_by_fastpath(client, workspace, body)
    assert fast_count == 0
    assert response.status_code == 401
    assert response.json()["type"] == "authentication_error"


def test_losing_the_membership_answers_404_at_once(client_for, workspace, profile):
    viewer = make_member(workspace, Role.VIEWER)
    client = client_for(viewer)
    body = {"entities": ["u1"], "features": FEATURES}
    post(client, workspace, body)
    assert served_by_fastpath(client, workspace, body)[1] == 1

    services.membership_revoke(actor=None, workspace=workspace, user=viewer)

    response, fast_count = served_by_fastpath(client, workspace, body)
    assert fast_count == 0
    assert response.status_code == 404


def test_other_workspaces_and_anonymous_callers(client_for, workspace, other_workspace, profile):
    outsider = make_member(other_workspace, Role.ADMIN)
    body = {"entities": ["u1"], "features": FEATURES}
    for _ in range(2):
        response, fast_count = served_by_fastpath(client_for(outsider), workspace, body)
        assert (response.status_code, fast_count) == (404, 0)
    response, fast_count = served_by_fastpath(client_for(None), workspace, body)
    assert (response.status_code, fast_count) == (401, 0)
    bad = client_for(None)
    bad.credentials(HTTP_AUTHORIZATION="Token rk_not-a-token")
    assert served_by_fastpath(bad, workspace, body)[0].status_code == 401


def test_a_token_scoped_to_another_workspace_gets_404(
    client_for, workspace, other_workspace, profile
):
    viewer = make_member(workspace, Role.VIEWER)
    services.membership_grant(actor=None, workspace=other_workspace, user=viewer, role=Role.VIEWER)
    client = client_for(viewer, workspaces=[other_workspace])
    body = {"entities": ["u1"], "features": FEATURES}
    for _ in range(2):
        response, fast_count = served_by_fastpath(client, workspace, body)
        assert (response.status_code, fast_count) == (404, 0)


def test_a_moved_access_generation_sends_the_request_the_slow_way_counted_once(
    client_for, workspace, profile
):
    """Another process changed tokens or the registry: its new generation is all this process
    sees (no local invalidation). The fast path must not answer from its cached entry, and the
    request is counted once for coverage."""
    client = client_for(make_member(workspace, Role.VIEWER))
    body = {"entities": ["u1", "nobody"], "features": ["profile:age"]}
    post(client, workspace, body)
    assert served_by_fastpath(client, workspace, body)[1] == 1
    store = online_store.get_online_store()
    counter = f"{workspace.pk}:{profile.pk}"
    before = store.coverage(counter=counter, buckets=[online_store.hour_bucket()])

    cache.set(access_cache.GENERATION_KEY, uuid.uuid4().hex, timeout=None)
    response, fast_count = served_by_fastpath(client, workspace, body)

    assert fast_count == 0
    assert response.json()["rows"] == [[21], [None]]
    after = store.coverage(counter=counter, buckets=[online_store.hour_bucket()])
    assert (after[0] - before[0], after[1] - before[1]) == (2, 1)
    # ... and the next request is fast again, under the new generation.
    assert served_by_fastpath(client, workspace, body)[1] == 1


def test_a_new_group_version_goes_live_on_the_fast_path(client_for, workspace, profile):
    from features import registry

    client = client_for(make_member(workspace, Role.VIEWER))
    body = {"entities": ["u1"], "features": ["profile:age"]}
    post(client, workspace, body)
    assert served_by_fastpath(client, workspace, body)[0].json()["rows"] == [[21]]

    registry.feature_group_new_version(
        actor=None,
        group=profile,
        features=[{"name": "age", "dtype": "int"}, {"name": "score", "dtype": "float"}],
    )

    # The registry write dropped the cached plan: this request plans again, on version 2.
    response, fast_count = served_by_fastpath(client, workspace, body)
    assert response.json()["rows"] == [[None]]  # version 2 has no rows yet
    assert fast_count == 1


def test_html_and_session_requests_are_left_to_drf(client_for, workspace, profile):
    client = client_for(make_member(workspace, Role.VIEWER))
    body = {"entities": ["u1"], "features": FEATURES}
    post(client, workspace, body)
    response, fast_count = served_by_fastpath(client, workspace, body, HTTP_ACCEPT="text/html")
    assert fast_count == 0
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
