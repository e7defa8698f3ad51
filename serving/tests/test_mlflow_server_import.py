"""A RankOps bundle logged with the stock ``mlflow`` client through the platform's MLflow server
(``/mlflow``, training.mlflow_server) imports into the workspace's registry, from its run or its
registered version; another workspace cannot import it."""

from __future__ import annotations

import json
import uuid

import pytest
import torch

from serving import registry
from serving.models import ModelVersion
from serving.tests.factories import make_scene, make_spec
from training.bundle import build_model
from training.tests.test_mlflow_server import stock_client
from workspaces.models import Role
from workspaces.testing.factories import make_member, make_workspace, token_for


@pytest.mark.django_db(transaction=True)
def test_a_bundle_logged_through_the_platforms_mlflow_imports_into_its_workspace_only(
    live_server, client_for, tmp_path
):
    workspace = make_workspace(slug=f"import-{uuid.uuid4().hex[:8]}")
    rival = make_workspace(slug=f"rival-{uuid.uuid4().hex[:8]}")
    actor = make_member(workspace, Role.DEVELOPER)
    outsider = make_member(rival, Role.DEVELOPER)
    scene = make_scene(workspace, actor, labels=20)
    spec = make_spec(scene)
    model = build_model(spec)
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_json()))
    torch.save(model.state_dict(), tmp_path / "state_dict.pth")

    logged = stock_client(
        f"{live_server.url}/mlflow",
        token_for(actor, workspaces=[workspace]),
        "bundle",
        str(tmp_path / "spec.json"),
        str(tmp_path / "state_dict.pth"),
    )
    url = f"/api/v1/workspaces/{workspace.slug}/model-versions/"
    sources = {
        "from-run": f"runs:/{logged['run_id']}/model",
        "from-registry": f"models:/{workspace.slug}.ranker/{logged['version']}",
        "from-logged-model": f"models:/{workspace.slug}.ranker/{logged['logged_model_version']}",
    }
    for name, source in sources.items():
        response = client_for(actor).post(url, {"model": name, "source": source}, format="json")
        assert response.status_code == 201, response.json()
        body = response.json()
        assert body["source"] == "mlflow_import" and body["metrics"] == {"auc": 0.73}
        version = ModelVersion.objects.for_workspace(workspace).get(pk=body["id"])
        loaded = registry.load_version(version)
        for key, tensor in model.state_dict().items():
            assert torch.equal(loaded.model.state_dict()[key], tensor)

    theirs = f"/api/v1/workspaces/{rival.slug}/model-versions/"
    for source in (*sources.values(), f"models:/{rival.slug}.ranker/{logged['version']}"):
        refused = client_for(outsider).post(
            theirs, {"model": "stolen", "source": source}, format="json"
        )
        assert refused.status_code == 404, (source, refused.json())
