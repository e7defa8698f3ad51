"""Every API route, run through every kind of caller.

Rows come from each app's tests/matrix.py; a route under /api/v1/ without a row fails here.
"""

from __future__ import annotations

import pytest

from workspaces.models import Event, Role
from workspaces.services import membership_grant
from workspaces.testing.factories import UserFactory, make_member
from workspaces.testing.permission_matrix import MatrixContext, api_routes, load_endpoints

ENDPOINTS = load_endpoints()
PRINCIPALS = ["anonymous", "outsider", *Role.values]
ENVELOPE_KEYS = {"type", "code", "detail", "attr"}


def expected_status(endpoint, principal: str) -> int:
    if endpoint.public:
        return endpoint.success
    if principal == "anonymous":
        return 401
    if not endpoint.workspace_scoped or endpoint.role is None:
        return endpoint.success
    if principal == "outsider":
        return 404
    return endpoint.success if Role.rank(principal) >= Role.rank(endpoint.role) else 403


def call(client, endpoint, url, body):
    return getattr(client, endpoint.method.lower())(url, body, format=endpoint.format)


def event_count() -> int:
    return Event.objects.unscoped().count()


def test_every_api_route_is_in_the_matrix():
    declared = {(e.method, e.path) for e in ENDPOINTS}
    served = api_routes()
    assert served, "no API routes found: the URLconf walk is broken"
    assert sorted(served - declared) == [], "routes without a permission-matrix row"
    assert sorted(declared - served) == [], "matrix rows for routes that do not exist"


def principal_user(principal: str, workspace):
    """The caller a principal names, made alone: one member of ``workspace`` with that role, a
    user of no workspace (``outsider``) or nobody (``anonymous``). Making all six for every row
    (the ``members`` fixture) was 40% of this file's time, for users the call never sees."""
    if principal == "anonymous":
        return None
    if principal == "outsider":
        return UserFactory()
    return make_member(workspace, principal)


def matrix_cases() -> list:
    """Every route with every principal. Which principals a route refuses (401, 403, the
    outsider's 404) and admits is decided by authentication and the membership lookup before
    the view runs, the same queries on either database; the view then does the same work for
    every role it admits. So each route's view runs on both databases once, with the first
    principal it admits (its least role), and the other principals run in one pass
    (``one_backend``, conftest.py): on PostgreSQL this file took 130 s with every case."""
    cases = []
    for endpoint in ENDPOINTS:
        admitted = [p for p in PRINCIPALS if expected_status(endpoint, p) < 400]
        for principal in PRINCIPALS:
            both = admitted and principal == admitted[0]
            cases.append(
                pytest.param(
                    endpoint,
                    principal,
                    id=f"{endpoint.id}-{principal}",
                    marks=[] if both else [pytest.mark.one_backend],
                )
            )
    return cases


@pytest.mark.parametrize(("endpoint", "principal"), matrix_cases())
def test_role_matrix(endpoint, principal, workspace, client_for):
    actor = principal_user(principal, workspace)
    url, body = endpoint.build(MatrixContext(actor=actor, workspace=workspace))
    client = client_for(actor)
    before = event_count()
    response = call(client, endpoint, url, body)
    expected = expected_status(endpoint, principal)
    assert response.status_code == expected, response.content[:500]
    if expected >= 400:
        assert set(response.json()) >= ENVELOPE_KEYS, response.content[:500]
        assert event_count() == before, "a refused request wrote to the event log"


SCOPED = [e for e in ENDPOINTS if e.workspace_scoped and not e.public]


@pytest.mark.parametrize("endpoint", SCOPED, ids=lambda e: e.id)
def test_admin_of_another_workspace_gets_404(endpoint, workspace, other_workspace, client_for):
    stranger = make_member(other_workspace, Role.ADMIN)
    url, body = endpoint.build(MatrixContext(actor=stranger, workspace=workspace))
    client = client_for(stranger)
    before = event_count()
    response = call(client, endpoint, url, body)
    assert response.status_code == 404, response.content[:500]
    assert event_count() == before


@pytest.mark.parametrize("endpoint", SCOPED, ids=lambda e: e.id)
def test_token_narrowed_to_another_workspace_gets_404(
    endpoint, workspace, other_workspace, client_for
):
    both = make_member(workspace, Role.ADMIN)
    membership_grant(actor=None, workspace=other_workspace, user=both, role=Role.ADMIN)
    url, body = endpoint.build(MatrixContext(actor=both, workspace=workspace))
    narrowed = client_for(both, workspaces=[other_workspace])
    response = call(narrowed, endpoint, url, body)
    assert response.status_code == 404, response.content[:500]
    # The same user with an unrestricted token reaches it: the 404 came from the token's scope.
    if endpoint.method == "GET":
        assert call(client_for(both), endpoint, url, body).status_code == endpoint.success


OBJECT_ROUTES = [e for e in SCOPED if e.has_object]


@pytest.mark.parametrize("endpoint", OBJECT_ROUTES, ids=lambda e: e.id)
def test_object_of_another_workspace_by_id_gets_404(
    endpoint, workspace, other_workspace, client_for
):
    """An object that exists in workspace B, addressed through workspace A's URL, is not found."""
    admin = make_member(workspace, Role.ADMIN)
    membership_grant(actor=None, workspace=other_workspace, user=admin, role=Role.ADMIN)
    url, body = endpoint.build(
        MatrixContext(actor=admin, workspace=other_workspace), url_workspace=workspace
    )
    client = client_for(admin)
    before = event_count()
    response = call(client, endpoint, url, body)
    assert response.status_code == 404, response.content[:500]
    assert event_count() == before
