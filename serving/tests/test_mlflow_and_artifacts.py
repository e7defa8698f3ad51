"""Acceptance: the stock MLflow client lists the platform's versions and a model it logged
imports; a planted pickle is refused and never unpickled; traversal and SSRF inputs get 400."""

import json
import pickle
from pathlib import Path

import mlflow
import pytest
import torch
from django.conf import settings

from serving import registry
from serving.models import ModelVersion
from serving.tests.factories import make_bundle, make_job, make_scene, make_spec
from serving.tests.helpers import workspace_experiment
from training.bundle import build_model
from workspaces.models import Role


class Planted:
    """A "model" whose unpickling would write a marker file (CVE-2024-37052 style)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


def _log_with_stock_client(workspace, spec, state_or_obj, *, weights_name="state_dict.pth"):
    """Logged in the workspace's own experiment: only those runs import into it."""
    mlflow.set_tracking_uri(settings.MLFLOW_TRACKING_URI)
    with mlflow.start_run(experiment_id=workspace_experiment(workspace)) as run:
        mlflow.log_dict(spec.to_json(), "model/spec.json")
        if isinstance(state_or_obj, dict):
            mlflow.pytorch.log_state_dict(state_or_obj, "model")
        else:
            tmp = Path(settings.ARTIFACT_ROOT).parent / f"upload-{run.info.run_id}"
            tmp.mkdir(parents=True, exist_ok=True)
            with open(tmp / weights_name, "wb") as fh:
                pickle.dump(state_or_obj, fh)
            mlflow.log_artifact(str(tmp / weights_name), "model")
        mlflow.log_metric("auc", 0.73)
    return run.info.run_id


@pytest.mark.django_db
def test_stock_mlflow_client_lists_versions_and_its_models_import(workspace, members, client_for):
    actor = members[Role.DEVELOPER]
    scene = make_scene(workspace, actor, labels=20)
    for seed in range(2):
        job = make_job(scene, make_bundle(make_spec(scene), seed=seed))
        registry.model_version_register(actor=actor, workspace=workspace, name="ranker", job=job)
    stock = mlflow.MlflowClient(tracking_uri=settings.MLFLOW_TRACKING_URI)
    listed = stock.search_model_versions(f"name='{workspace.slug}.ranker'")
    assert sorted(int(v.version) for v in listed) == [1, 2]
    assert (
        str(stock.get_model_version_by_alias(f"{workspace.slug}.ranker", "candidate").version)
        == "2"
    )

    spec = make_spec(scene)
    model = build_model(spec)
    run_id = _log_with_stock_client(workspace, spec, model.state_dict())
    client = client_for(actor)
    url = f"/api/v1/workspaces/{workspace.slug}/model-versions/"
    response = client.post(
        url, {"model": "imported", "source": f"runs:/{run_id}/model"}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["source"] == "mlflow_import" and body["metrics"] == {"auc": 0.73}
    version = ModelVersion.objects.for_workspace(workspace).get(pk=body["id"])
    loaded = registry.load_version(version)
    for key, tensor in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], tensor)
    assert [
        int(v.version) for v in stock.search_model_versions(f"name='{workspace.slug}.imported'")
    ] == [1]


@pytest.mark.django_db
def test_planted_pickles_are_refused_and_never_unpickled(workspace, members, client_for, tmp_path):
    actor = members[Role.DEVELOPER]
    marker = tmp_path / "marker.txt"
    scene = make_scene(workspace, actor, labels=20)
    spec = make_spec(scene)
    # 1. Imported from MLflow: a pickled object where the state dict should be.
    run_id = _log_with_stock_client(
        workspace, spec, Planted(str(marker)), weights_name="state_dict.pth.pkl"
    )
    client = client_for(actor)
    url = f"/api/v1/workspaces/{workspace.slug}/model-versions/"
    response = client.post(url, {"model": "evil", "source": f"runs:/{run_id}/model"}, format="json")
    assert response.status_code == 400
    # Named state_dict.pth this time (what the importer does load, with weights_only=True).
    run_id = _log_with_stock_client(
        workspace, spec, Planted(str(marker)), weights_name="state_dict.pth"
    )
    response = client.post(url, {"model": "evil", "source": f"runs:/{run_id}/model"}, format="json")
    assert response.status_code == 400
    assert "refused" in json.dumps(response.json())
    # 2. Planted in the artifact store as a bundle's weights (a job pointing at it).
    bundle = make_bundle(spec, name="planted")
    with open(bundle / "weights.pt", "wb") as fh:
        pickle.dump(Planted(str(marker)), fh)
    job = make_job(scene, bundle)
    response = client.post(url, {"model": "evil", "job_id": job.pk}, format="json")
    assert response.status_code == 400
    assert not marker.exists()
    assert not ModelVersion.objects.for_workspace(workspace).filter(model__name="evil").exists()


BAD_SOURCES = [
    "runs:/../../../../etc/passwd",
    "runs:/abc/%2e%2e%2f%2e%2e%2fetc",
    "runs:/abc/%252e%252e%252fetc",
    "runs:/abc/model?..",
    "runs:/abc/model#/../../",
    "runs:/abc/model;rm",
    "runs:/abc\\..\\..\\etc",
    "file:///etc/",
    "/etc/passwd",
    "http://169.254.169.254/latest/meta-data/",
    "http://127.0.0.1:5000/model",
    "http://localhost/model",
    "http://[::1]/model",
    "https://10.0.0.5/model",
    "gopher://example.com/x",
    "ftp://example.com/x",
    "runs:/abc/\x00",
    "no-colon-at-all",
    "models:/ws.ranker/Production",
]


@pytest.mark.django_db
@pytest.mark.parametrize("source", BAD_SOURCES)
def test_traversal_and_ssrf_sources_are_refused_with_400(workspace, members, client_for, source):
    client = client_for(members[Role.DEVELOPER])
    url = f"/api/v1/workspaces/{workspace.slug}/model-versions/"
    response = client.post(url, {"model": "evil", "source": source}, format="json")
    assert response.status_code == 400, (source, response.content)


BAD_PATHS = [
    "../../../../etc/passwd",
    "%2e%2e%2f%2e%2e%2fetc",
    "%252e%252e%252fetc",
    "a/?../b",
    "a/#/../../b",
    "a;b",
    "a\\..\\b",
    "/etc/passwd",
    "a/\x00",
    "x" * 300,
    "a\u2215..\u2215b",
    "a/\uff0e\uff0e/b",
]


@pytest.mark.parametrize("path", BAD_PATHS)
def test_artifact_paths_are_validated(path):
    from django.core.exceptions import ValidationError

    from serving.artifacts import resolve_artifact

    with pytest.raises(ValidationError):
        resolve_artifact(path)


@pytest.mark.django_db
def test_symlink_out_of_the_store_is_refused(workspace, members, tmp_path):
    from django.core.exceptions import ValidationError

    actor = members[Role.DEVELOPER]
    scene = make_scene(workspace, actor, labels=20)
    outside = make_bundle(make_spec(scene), name="outside-src")
    target = tmp_path / "outside"
    outside.rename(target)
    link = Path(settings.ARTIFACT_ROOT) / "test-bundles" / "link"
    link.symlink_to(target)
    job = make_job(scene, link)
    with pytest.raises(ValidationError):
        registry.model_version_register(actor=actor, workspace=workspace, name="ln", job=job)
    # A sibling prefix is not the same directory (foo vs foobar).
    from serving.artifacts import resolve_inside

    root = tmp_path / "foo"
    root.mkdir()
    (tmp_path / "foobar").mkdir()
    with pytest.raises(ValidationError):
        resolve_inside(root, "../foobar")
