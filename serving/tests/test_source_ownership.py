"""An MLflow import source is read only when it is proven to belong to the caller's workspace:
a run of its experiment ``rankops/<slug>``, a model named ``<slug>.<name>``, a file under
``MLFLOW_ARTIFACT_ROOT/<slug>``. Anything else answers the 404 of a missing source and copies
nothing. (The same references run through the body-reference matrix as well.)"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

import mlflow
import pytest
from django.conf import settings

from serving.models import ModelVersion
from serving.tests.helpers import log_stock_run, register_stock_model, workspace_experiment
from training.bundle import BundleSpec, FeatureSpec, build_model
from workspaces.models import Role
from workspaces.services import membership_grant
from workspaces.testing.factories import make_member, make_workspace

pytestmark = pytest.mark.django_db

SPEC = BundleSpec(
    template="logreg",
    features=[FeatureSpec(ref="ctx:hour", column="ctx__hour", dtype="float", entity="context")],
)
MISSING_RUN = "0" * 32


def _state() -> dict:
    return build_model(SPEC).state_dict()


def _files() -> set[str]:
    root = Path(settings.ARTIFACT_ROOT)
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


@pytest.fixture
def admin(workspace, other_workspace):
    """An admin of both workspaces: being able to see the other one must not be enough."""
    user = make_member(workspace, Role.ADMIN)
    membership_grant(actor=None, workspace=other_workspace, user=user, role=Role.ADMIN)
    return user


@pytest.fixture
def caller(admin, client_for):
    return client_for(admin)


def _artifact_dir(run_id: str) -> Path:
    uri = mlflow.MlflowClient(settings.MLFLOW_TRACKING_URI).get_run(run_id).info.artifact_uri
    return Path(unquote(urlsplit(uri).path))


def _post(client, workspace, source, model="imported"):
    return client.post(
        f"/api/v1/workspaces/{workspace.slug}/model-versions/",
        {"model": model, "source": source},
        format="json",
    )


def _refused_like_a_missing_run(client, workspace, source):
    before_rows, before_files = ModelVersion.objects.for_workspace(workspace).count(), _files()
    response = _post(client, workspace, source)
    assert response.status_code == 404, response.content[:500]
    missing = _post(client, workspace, f"runs:/{MISSING_RUN}/model")
    assert response.json() == missing.json()
    assert ModelVersion.objects.for_workspace(workspace).count() == before_rows
    assert _files() == before_files
    return response


def test_own_run_model_and_file_import(workspace, caller):
    """The positive control: the same three kinds of source, in the caller's workspace."""
    run_id = log_stock_run(workspace, SPEC, _state())
    response = _post(caller, workspace, f"runs:/{run_id}/model", model="by-run")
    assert response.status_code == 201, response.content[:500]
    assert response.json()["metrics"] == {"auc": 0.73}
    uri = register_stock_model(workspace, "logged", run_id)
    assert _post(caller, workspace, uri, model="by-model").status_code == 201
    folder = (_artifact_dir(run_id) / "model").as_uri()
    assert _post(caller, workspace, folder, model="by-file").status_code == 201
    # A version the platform itself registered, read back by alias.
    alias = f"models:/{workspace.slug}.by-run@candidate"
    assert _post(caller, workspace, alias, model="by-alias").status_code == 201


def test_another_workspaces_run_model_and_file_answer_404(workspace, other_workspace, caller):
    run_id = log_stock_run(other_workspace, SPEC, _state())
    uri = register_stock_model(other_workspace, "theirs", run_id)
    folder = (_artifact_dir(run_id) / "model").as_uri()
    for source in (f"runs:/{run_id}/model", uri, folder):
        _refused_like_a_missing_run(caller, workspace, source)
    # The guessable name of the other workspace's platform-registered model, too.
    assert _post(caller, other_workspace, f"runs:/{run_id}/model", model="r").status_code == 201
    _refused_like_a_missing_run(caller, workspace, f"models:/{other_workspace.slug}.r/1")


def test_a_model_named_like_ours_whose_files_are_theirs_answers_404(
    workspace, other_workspace, caller
):
    """The name is ours (anyone with MLflow access can pick it) but the version points at a run
    or a folder of the other workspace."""
    theirs = log_stock_run(other_workspace, SPEC, _state())
    client = mlflow.MlflowClient(settings.MLFLOW_TRACKING_URI)
    _refused_like_a_missing_run(caller, workspace, register_stock_model(workspace, "a", theirs))
    name = f"{workspace.slug}.b"
    client.create_registered_model(name)
    folder = (_artifact_dir(theirs) / "model").as_uri()
    version = client.create_model_version(name, source=folder)
    _refused_like_a_missing_run(caller, workspace, f"models:/{name}/{version.version}")


def test_runs_that_only_claim_the_workspace_answer_404(workspace, other_workspace, caller):
    # Tagged ours, logged in another experiment.
    mlflow.set_tracking_uri(settings.MLFLOW_TRACKING_URI)
    outside = mlflow.create_experiment(
        f"outside-{os.getpid()}-{workspace.slug}",
        artifact_location=(Path(settings.MLFLOW_ARTIFACT_ROOT) / workspace.slug).as_uri(),
    )
    with mlflow.start_run(experiment_id=outside, tags={"rankops.workspace": workspace.slug}) as run:
        mlflow.log_dict(SPEC.to_json(), "model/spec.json")
        mlflow.pytorch.log_state_dict(_state(), "model")
    _refused_like_a_missing_run(caller, workspace, f"runs:/{run.info.run_id}/model")
    # In our experiment, tagged as the other workspace's.
    tagged = log_stock_run(workspace, SPEC, _state(), tags={"rankops.workspace": "x"})
    _refused_like_a_missing_run(caller, workspace, f"runs:/{tagged}/model")


def test_our_experiment_storing_in_their_folder_answers_404(admin, caller, other_workspace):
    """An experiment ``rankops/<slug>`` made (before any job) with its artifacts in another
    workspace's folder: its runs' files are not ours."""
    fresh = make_workspace()
    membership_grant(actor=None, workspace=fresh, user=admin, role=Role.ADMIN)
    client = mlflow.MlflowClient(settings.MLFLOW_TRACKING_URI)
    client.create_experiment(
        f"rankops/{fresh.slug}",
        artifact_location=(Path(settings.MLFLOW_ARTIFACT_ROOT) / other_workspace.slug).as_uri(),
    )
    assert workspace_experiment(fresh)  # the same experiment, not a new one
    run_id = log_stock_run(fresh, SPEC, _state())
    _refused_like_a_missing_run(caller, fresh, f"runs:/{run_id}/model")


def test_a_symlink_in_our_folder_to_theirs_answers_404(workspace, other_workspace, caller):
    theirs = log_stock_run(other_workspace, SPEC, _state())
    folder = _artifact_dir(theirs)
    ours = Path(settings.MLFLOW_ARTIFACT_ROOT) / workspace.slug / "planted"
    ours.parent.mkdir(parents=True, exist_ok=True)
    ours.symlink_to(folder / "model", target_is_directory=True)
    _refused_like_a_missing_run(caller, workspace, ours.as_uri())


def test_a_source_without_a_scheme_is_a_400_naming_the_field(workspace, caller):
    for source in ("ranker", "ranker/1", f"{workspace.slug}.ranker"):
        response = _post(caller, workspace, source)
        assert response.status_code == 400, response.content[:500]
        assert response.json()["attr"] == "source"
