"""The gateway's metric labels stay bounded: a deployment that exists keeps its name (also when
this process has not served it yet), any other name is counted under one label value; /metrics
answers 401 without the METRICS_TOKEN the settings name."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import REGISTRY

from experiments.tests.factories import make_deployment
from serving.metrics import DEPLOYMENT_NAMES, REQUESTS, UNKNOWN_DEPLOYMENT
from workspaces.models import Role
from workspaces.testing.factories import make_member, make_workspace, token_for


def _count(workspace: str, deployment: str, outcome: str = "invalid") -> float:
    labels = {"workspace": workspace, "deployment": deployment, "version": "", "outcome": outcome}
    return REGISTRY.get_sample_value("rankops_serving_requests_total", labels) or 0.0


@pytest.mark.django_db
def test_real_deployments_keep_their_label_and_made_up_names_share_one(client, settings):
    DEPLOYMENT_NAMES.clear()
    workspace = make_workspace(slug=f"labels-{uuid.uuid4().hex[:6]}")
    make_deployment(workspace, name="ranker")
    token = token_for(make_member(workspace, Role.DEVELOPER), workspaces=[workspace])
    url = f"/api/v1/workspaces/{workspace.slug}/predict/"
    auth = {"HTTP_AUTHORIZATION": f"Token {token}"}

    def predict(deployment: str, candidates: list) -> int:
        body = {"deployment": deployment, "user": "u1", "candidates": candidates}
        return client.post(url, body, content_type="application/json", **auth).status_code

    unknown_before = _count(workspace.slug, UNKNOWN_DEPLOYMENT)
    # An error counted for a real deployment this process never served: looked up, kept.
    REQUESTS.labels(workspace.slug, "ranker", "", "invalid").inc()
    made_up = [f"ghost-{i}" for i in range(5)]
    assert [predict(name, ["i1"]) for name in made_up] == [404] * 5
    assert _count(workspace.slug, "ranker") == 1
    assert _count(workspace.slug, UNKNOWN_DEPLOYMENT) == unknown_before + 5
    assert all(_count(workspace.slug, name) == 0 for name in made_up)

    body = client.get("/metrics").content.decode()
    assert "ghost-" not in body and f'deployment="{UNKNOWN_DEPLOYMENT}"' in body

    settings.METRICS_TOKEN = "s3cret"
    refused = client.get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    scraped = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert scraped.status_code == 200 and b"rankops_serving_requests_total" in scraped.content
