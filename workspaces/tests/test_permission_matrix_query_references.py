"""The permission matrix, for references in query strings.

Every query parameter that names another object (``?dataset=<id>``, ``?model=<name>``,
``?object=<kind>:<id>``, ``?node=<kind>:<id>``) is run with that object made in another
workspace, by an admin of both workspaces (seeing the other workspace must not be enough): a
filter answers an empty page and a lookup 404 naming the parameter, exactly what the call answers
for an object that does not exist, and the same call naming an object of its own workspace finds
it (so the empty answer came from the scoping, not from a filter that matches nothing).
"""

from __future__ import annotations

import pytest

from workspaces.models import Role
from workspaces.services import membership_grant
from workspaces.testing.factories import make_member
from workspaces.testing.permission_matrix import (
    MatrixContext,
    load_query_references,
    reference_masked,
)

QUERY_REFERENCES = load_query_references()
ENVELOPE_KEYS = {"type", "code", "detail", "attr"}


def test_every_app_with_query_references_declares_some():
    assert {ref.param for ref in QUERY_REFERENCES} >= {"dataset", "model", "object", "node"}


@pytest.mark.parametrize("ref", QUERY_REFERENCES, ids=lambda r: r.id)
def test_another_workspaces_object_in_the_query_answers_like_a_missing_one(
    ref, workspace, other_workspace, client_for
):
    admin = make_member(workspace, Role.ADMIN)
    membership_grant(actor=None, workspace=other_workspace, user=admin, role=Role.ADMIN)
    home = MatrixContext(actor=admin, workspace=workspace)
    away = MatrixContext(actor=admin, workspace=other_workspace, extra={"home": home.extra})
    client = client_for(admin)
    url = ref.url(home)
    theirs = ref.make(away)

    response = client.get(url, ref.params(home, theirs))

    assert response.status_code == ref.status, response.content[:500]
    body = response.json()
    if ref.status == 404:
        assert set(body) >= ENVELOPE_KEYS
        assert (body["type"], body["attr"]) == ("not_found", ref.param), body
    else:
        assert (body["count"], body["results"]) == (0, []), body
    absent = client.get(url, ref.params(home, ref.missing))
    assert absent.status_code == ref.status
    assert reference_masked(absent.json(), ref.missing) == reference_masked(body, theirs)
    # The control: naming its own workspace's object finds it.
    own = client.get(url, ref.params(home, ref.make(home)))
    assert own.status_code == 200, own.content[:500]
    if ref.status == 200:
        assert own.json()["count"] >= 1, own.json()
