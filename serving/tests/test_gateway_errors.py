"""The gateway answers errors in the API's envelope (the same ``type`` per status), and a stopped
deployment serves nothing through either protocol (issue 17)."""

from __future__ import annotations

import pytest

from serving.deployments import deployment_stop
from serving.routing import TABLES
from serving.tests.helpers import deployed, predict_body
from workspaces.models import Role

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_tables():
    TABLES.clear()
    yield
    TABLES.clear()


def test_gateway_errors_carry_the_api_types_and_a_stopped_deployment_serves_nothing(
    workspace, members, client_for, django_capture_on_commit_callbacks
):
    actor = members[Role.MAINTAINER]
    scene, _, dep = deployed(workspace, actor, versions=1)
    client = client_for(actor)
    url = f"/api/v1/workspaces/{workspace.slug}/predict/"
    name = f"{workspace.slug}.main"

    missing = client.post(
        url, predict_body(scene, request_id="r0", deployment="nope"), format="json"
    )
    assert missing.status_code == 404
    assert (missing.json()["type"], missing.json()["code"]) == ("not_found", "not_found")
    assert client.get(f"/v2/models/{workspace.slug}.nope").json()["type"] == "not_found"
    anonymous = client_for(None).post(url, {}, format="json")
    assert anonymous.status_code == 401
    assert anonymous.json()["type"] == "authentication_error"
    assert client.post(url, [1], format="json").json()["type"] == "validation_error"
    assert client.post(url, predict_body(scene, request_id="r1"), format="json").status_code == 200
    assert client.get(f"/v2/models/{name}/ready").json() == {"name": name, "ready": True}

    with django_capture_on_commit_callbacks(execute=True):
        deployment_stop(actor=actor, workspace=workspace, deployment=dep, reason="test")

    stopped = client.post(url, predict_body(scene, request_id="r2"), format="json")
    assert stopped.status_code == 409
    assert (stopped.json()["type"], stopped.json()["attr"]) == ("conflict", "deployment")
    ready = client.get(f"/v2/models/{name}/ready")
    assert (ready.status_code, ready.json()["ready"]) == (503, False)
    infer = client.post(
        f"/v2/models/{name}/infer",
        {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [1.0]}]},
        format="json",
    )
    assert infer.status_code == 409
    assert infer.json()["type"] == "conflict" and "stopped" in infer.json()["detail"]
