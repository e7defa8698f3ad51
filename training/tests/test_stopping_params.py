"""The split, early-stopping and calibration params at job creation: a value their schema does
not allow answers 400 naming the param and what it allows (the runner's behaviour is in
``test_early_stopping.py``)."""

from __future__ import annotations

import pytest

from training.models import TrainingJob
from training.tests.factories import make_demo_dataset
from workspaces.models import Role
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("params", "attr", "message"),
    [
        (
            {"calibration": "platt"},
            "params.calibration",
            "Give one of: temperature, isotonic, none.",
        ),
        (
            {"early_stopping_metric": "ndcg"},
            "params.early_stopping_metric",
            "Give one of: logloss, auc.",
        ),
        (
            {"validation_fraction": 0.6},
            "params.validation_fraction",
            "Give a number from 0 to 0.5.",
        ),
        (
            {"early_stopping_patience": -1},
            "params.early_stopping_patience",
            "Give a whole number from 0 to 1000.",
        ),
        ({"split_column": 3}, "params.split_column", "Give text."),
    ],
)
def test_a_bad_split_stopping_or_calibration_param_is_400(
    workspace, client_for, params, attr, message
):
    dataset = make_demo_dataset(workspace, scale=0.01)
    client = client_for(make_member(workspace, Role.DEVELOPER))
    body = {"name": "ctr", "template": "fine_ranking", "dataset": dataset.pk, "params": params}
    response = client.post(
        f"/api/v1/workspaces/{workspace.slug}/training-jobs/", body, format="json"
    )
    assert response.status_code == 400, response.content
    errors = {e["attr"]: e["detail"] for e in response.json().get("errors") or [response.json()]}
    assert errors == {attr: message}
    assert not TrainingJob.objects.for_workspace(workspace).exists()


def test_a_split_column_the_dataset_lacks_is_400_listing_its_columns(workspace, client_for):
    dataset = make_demo_dataset(workspace, scale=0.01)
    client = client_for(make_member(workspace, Role.DEVELOPER))
    url = f"/api/v1/workspaces/{workspace.slug}/training-jobs/"
    body = {"name": "ctr", "template": "logreg", "dataset": dataset.pk}
    response = client.post(url, {**body, "params": {"split_column": "fold"}}, format="json")
    assert response.status_code == 400, response.content
    errors = {e["attr"]: e["detail"] for e in response.json().get("errors") or [response.json()]}
    assert list(errors) == ["params.split_column"]
    assert "no column 'fold'" in errors["params.split_column"]
    assert "click" in errors["params.split_column"]  # it lists the columns there are
    assert not TrainingJob.objects.for_workspace(workspace).exists()
    # a column the file has passes this check
    ok = client.post(url, {**body, "params": {"split_column": "click"}}, format="json")
    assert ok.status_code == 201, ok.content
