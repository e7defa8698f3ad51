"""The permission matrix, for references in request bodies.

Every body field that names another object (an id, a name, a ``models:/``, ``runs:/`` or
``file://`` source) is run with that object made in another workspace, by an admin of both
workspaces (seeing the other workspace must not be enough): the call answers exactly what it
answers for an object that does not exist (404 naming the field), no row and no file is written,
and the same call naming an object of its own workspace succeeds (so the refusal came from the
reference)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings

from workspaces.models import Role
from workspaces.services import membership_grant
from workspaces.testing.factories import make_member
from workspaces.testing.permission_matrix import (
    MatrixContext,
    load_body_references,
    load_endpoints,
    reference_masked,
)

REFERENCES, NO_REFERENCES = load_body_references()
ENVELOPE_KEYS = {"type", "code", "detail", "attr"}
PROJECT_APPS = {"workspaces", "features", "training", "scheduler", "serving", "experiments"}
PROJECT_APPS |= {"lineage"}


def call(client, ref, url, body):
    return getattr(client, ref.method.lower())(url, body, format=ref.format)


def written() -> dict[str, object]:
    """Rows of every project table, and the files under the artifact stores."""
    state: dict[str, object] = {
        model._meta.label: model._base_manager.count()
        for config in apps.get_app_configs()
        if config.label in PROJECT_APPS
        for model in config.get_models()
    }
    for root in (settings.ARTIFACT_ROOT, settings.MLFLOW_ARTIFACT_ROOT):
        path = Path(root)
        state[root] = sorted(str(p) for p in path.rglob("*")) if path.exists() else []
    return state


def test_every_write_route_declares_its_body_references():
    writes = {
        e.id for e in load_endpoints() if e.method != "GET" and e.workspace_scoped and not e.public
    }
    declared = {r.endpoint_id for r in REFERENCES} | set(NO_REFERENCES)
    assert sorted(writes - declared) == [], "write routes without body-reference rows"
    assert sorted(declared - writes) == [], "body-reference rows for routes that do not exist"
    assert not {r.endpoint_id for r in REFERENCES} & set(NO_REFERENCES)


@pytest.mark.parametrize("ref", REFERENCES, ids=lambda r: r.id)
def test_another_workspaces_object_in_the_body_answers_like_a_missing_one(
    ref, workspace, other_workspace, client_for
):
    admin = make_member(workspace, Role.ADMIN)
    membership_grant(actor=None, workspace=other_workspace, user=admin, role=Role.ADMIN)
    home = MatrixContext(actor=admin, workspace=workspace)
    # make() in the other workspace can read what setup() left (a deployment's model name).
    away = MatrixContext(actor=admin, workspace=other_workspace, extra={"home": home.extra})
    client = client_for(admin)
    url = ref.url(home)
    theirs = ref.make(away)
    foreign = ref.body(home, theirs)
    missing = ref.body(home, ref.missing)
    before = written()

    response = call(client, ref, url, foreign)

    assert response.status_code == ref.status, response.content[:500]
    assert set(response.json()) >= ENVELOPE_KEYS
    assert response.json()["attr"] == (ref.attr or ref.field), response.json()
    if ref.status == 404:
        assert response.json()["type"] == "not_found", response.json()
    assert written() == before, "a refused reference wrote rows or files"
    absent = call(client, ref, url, missing)
    # The same body (a message may quote the reference the caller sent, nothing else).
    assert reference_masked(absent.json(), ref.missing) == reference_masked(response.json(), theirs)
    assert written() == before
    # The control: the same call naming its own workspace's object goes through.
    own = call(client, ref, url, ref.body(home, ref.make(home)))
    assert own.status_code == ref.success, own.content[:500]
