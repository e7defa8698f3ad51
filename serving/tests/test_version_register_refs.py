"""Registering a version names a deployment to release it to (``auto_deploy``): one of another
model is refused before anything is written, not after the version exists."""

import pytest

from serving.models import ModelVersion
from serving.tests.factories import make_bundle, make_job, make_spec
from serving.tests.helpers import deployed
from workspaces.models import Role

pytestmark = pytest.mark.django_db


def test_auto_deploy_to_a_deployment_of_another_model_writes_nothing(
    workspace, members, client_for
):
    actor = members[Role.MAINTAINER]
    scene, _, _ = deployed(workspace, actor, versions=1, name="main")  # serves "ranker"
    job = make_job(scene, make_bundle(make_spec(scene), seed=5))
    client = client_for(actor)
    url = f"/api/v1/workspaces/{workspace.slug}/model-versions/"
    before = ModelVersion.objects.for_workspace(workspace).count()

    response = client.post(
        url, {"model": "other", "job_id": job.pk, "auto_deploy": "main"}, format="json"
    )

    assert response.status_code == 400, response.content[:500]
    assert response.json()["attr"] == "auto_deploy"
    assert ModelVersion.objects.for_workspace(workspace).count() == before
    # The control: the deployment's own model is released to it.
    response = client.post(
        url, {"model": "ranker", "job_id": job.pk, "auto_deploy": "main"}, format="json"
    )
    assert response.status_code == 201, response.content[:500]
