"""A lone surrogate (the JSON escape \\ud800 without its pair: not Unicode text) in a JSON body
answers 400 naming the problem, on the endpoints that take free text, instead of a server error
when the database or the JSON renderer cannot encode it."""

from __future__ import annotations

import json
import socket

import pytest

from experiments.tests.factories import make_deployment
from features.models import FeatureGroup
from training.models import TrainingJob
from training.tests.factories import make_demo_dataset
from workspaces.models import Role, WebhookEndpoint

pytestmark = pytest.mark.django_db

MARK = "LONE-SURROGATE"


def _ws(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.slug}"


def _post_with_lone_surrogate(client, url: str, body: dict):
    """POST ``body`` as JSON text where MARK becomes the escape itself (a Python string with a
    surrogate could not be encoded by the test client)."""
    text = json.dumps(body).replace(MARK, "\\ud800")
    return client.post(url, text.encode("ascii"), content_type="application/json")


def _assert_refused(response, where: str) -> None:
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert (body["type"], body["code"], body["attr"]) == ("validation_error", "parse_error", None)
    assert "lone surrogate" in body["detail"]
    assert repr(where) in body["detail"]


def test_feature_group_register(client_for, workspace, members):
    body = {
        "name": "ad_profile",
        "entity": "item",
        "entity_key": "ad_id",
        "features": [{"name": "price", "dtype": "float", "description": f"List {MARK}"}],
    }
    client = client_for(members[Role.DEVELOPER])
    response = _post_with_lone_surrogate(client, f"{_ws(workspace)}/feature-groups/", body)
    _assert_refused(response, "features.0.description")
    assert not FeatureGroup.objects.for_workspace(workspace).exists()


def test_training_job_submit(client_for, workspace, members):
    dataset = make_demo_dataset(workspace, scale=0.01)
    body = {
        "name": "ctr",
        "template": "fine_ranking",
        "dataset": dataset.pk,
        "params": {"epochs": 1, "optimizer": MARK},
    }
    client = client_for(members[Role.DEVELOPER])
    response = _post_with_lone_surrogate(client, f"{_ws(workspace)}/training-jobs/", body)
    _assert_refused(response, "params.optimizer")
    assert not TrainingJob.objects.for_workspace(workspace).exists()


def test_model_version_register(client_for, workspace, members):
    body = {"model": "ranker", "source": "models:/ranker/1", "description": MARK}
    client = client_for(members[Role.DEVELOPER])
    response = _post_with_lone_surrogate(client, f"{_ws(workspace)}/model-versions/", body)
    _assert_refused(response, "description")


def test_experiment_create(client_for, workspace, members):
    dep, (treatment,) = make_deployment(workspace)
    body = {
        "key": "ab-1",
        "hypothesis": "lift",
        "deployment": dep.name,
        "treatment_versions": [treatment.pk],
        "guardrails": [{"metric": f"ctr{MARK}", "max_drop": 0.1}],
    }
    client = client_for(members[Role.DEVELOPER])
    response = _post_with_lone_surrogate(client, f"{_ws(workspace)}/experiments/", body)
    _assert_refused(response, "guardrails.0.metric")


def test_webhook_create(client_for, workspace, members, monkeypatch):
    def public_address(host, port, *args, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port or 443))]

    monkeypatch.setattr(socket, "getaddrinfo", public_address)
    body = {"url": f"https://hooks.example.com/{MARK}"}
    client = client_for(members[Role.ADMIN])
    response = _post_with_lone_surrogate(client, f"{_ws(workspace)}/webhooks/", body)
    _assert_refused(response, "url")
    assert not WebhookEndpoint.objects.for_workspace(workspace).exists()


def test_a_surrogate_key_is_named(client_for, workspace, members):
    client = client_for(members[Role.DEVELOPER])
    response = _post_with_lone_surrogate(
        client, f"{_ws(workspace)}/model-versions/", {"model": "ranker", MARK: 1}
    )
    assert response.status_code == 400
    assert "lone surrogate" in response.json()["detail"]


def test_a_surrogate_pair_is_text_and_an_escaped_backslash_is_no_escape(
    client_for, workspace, members
):
    # An emoji written as its escaped pair, and a literal backslash followed by "ud800".
    description = "\\ud83d\\ude00 \\\\ud800"
    body = {
        "name": "ad_profile",
        "entity": "item",
        "entity_key": "ad_id",
        "features": [{"name": "price", "dtype": "float", "description": MARK}],
    }
    text = json.dumps(body).replace(MARK, description)
    client = client_for(members[Role.DEVELOPER])
    response = client.post(
        f"{_ws(workspace)}/feature-groups/", text.encode("ascii"), content_type="application/json"
    )
    assert response.status_code == 201, response.content
    (feature,) = response.json()["feature_set"]
    assert feature["description"] == "\U0001f600 \\ud800"
