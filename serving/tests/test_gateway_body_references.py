"""The gateway's body and model-name references: another workspace's deployment, named in
``/predict/``'s body or in an Open Inference Protocol model name, answers the 404 of a missing
one (the lean views are outside the body-reference matrix, which covers the DRF routes)."""

import json

import pytest

from serving.tests.helpers import deployed, predict_body
from workspaces.models import Role
from workspaces.services import membership_grant
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db


def test_another_workspaces_deployment_answers_like_a_missing_one(
    workspace, other_workspace, client_for
):
    admin = make_member(workspace, Role.ADMIN)
    membership_grant(actor=None, workspace=other_workspace, user=admin, role=Role.ADMIN)
    deployed(workspace, admin, versions=1, name="mine")
    scene, _, _ = deployed(other_workspace, admin, versions=1, name="theirs")
    client = client_for(admin)
    body = predict_body(scene, request_id="r-theirs", deployment="theirs")
    missing = predict_body(scene, request_id="r-theirs", deployment="nowhere")

    def predict(slug, payload):
        return client.post(f"/api/v1/workspaces/{slug}/predict/", payload, format="json")

    response = predict(workspace.slug, body)
    assert response.status_code == 404, response.content[:500]
    absent = json.dumps(predict(workspace.slug, missing).json(), sort_keys=True)
    assert json.dumps(response.json(), sort_keys=True) == absent.replace("nowhere", "theirs")
    # The control: the same body in its own workspace is served.
    assert predict(other_workspace.slug, body).status_code == 200

    oip = {"inputs": [{"name": "user_id", "shape": [1], "datatype": "BYTES", "data": ["u1"]}]}
    url = f"/v2/models/{workspace.slug}.theirs/infer"
    assert client.post(url, oip, format="json").status_code == 404
    assert client.get(f"/v2/models/{workspace.slug}.theirs/ready").status_code == 404
    assert client.get(f"/v2/models/{other_workspace.slug}.theirs/ready").status_code == 200
