"""Training length within the workspace policy: ``epochs`` and ``max_steps`` over the limit (or
not whole numbers) answer 400 naming the field, and no job is created."""

from __future__ import annotations

import pytest

from training.models import TrainingJob
from training.tests.factories import make_demo_dataset
from workspaces.models import Role
from workspaces.services import workspace_policy_set
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db


@pytest.fixture
def dev(workspace, client_for):
    return client_for(make_member(workspace, Role.DEVELOPER))


@pytest.fixture
def dataset(workspace):
    return make_demo_dataset(workspace, scale=0.01)


def _submit(client, workspace, dataset, params):
    body = {"name": "ctr", "template": "logreg", "dataset": dataset.pk, "params": params}
    return client.post(f"/api/v1/workspaces/{workspace.slug}/training-jobs/", body, format="json")


@pytest.mark.parametrize(
    ("params", "attr"),
    [
        ({"epochs": 1e9}, "params.epochs"),
        ({"epochs": 1001}, "params.epochs"),
        ({"epochs": 0}, "params.epochs"),
        ({"epochs": 2.5}, "params.epochs"),
        ({"epochs": "3"}, "params.epochs"),
        ({"epochs": True}, "params.epochs"),
        ({"max_steps": 10**12}, "params.max_steps"),
        ({"max_steps": -1}, "params.max_steps"),
    ],
)
def test_training_length_over_the_policy_is_400_naming_the_field(
    workspace, dev, dataset, params, attr
):
    response = _submit(dev, workspace, dataset, params)
    assert response.status_code == 400, response.content
    body = response.json()
    assert attr in {body["attr"]} | {e["attr"] for e in body["errors"]}
    assert not TrainingJob.objects.for_workspace(workspace).exists()


def test_the_limit_is_the_workspaces_own(workspace, dev, dataset):
    workspace_policy_set(actor=None, workspace=workspace, max_job_epochs=2, max_job_steps=50)
    assert _submit(dev, workspace, dataset, {"epochs": 3}).status_code == 400
    assert _submit(dev, workspace, dataset, {"max_steps": 51}).status_code == 400
    assert not TrainingJob.objects.for_workspace(workspace).exists()
    accepted = _submit(dev, workspace, dataset, {"epochs": 2.0, "max_steps": 50})
    assert accepted.status_code == 201, accepted.content
    job = TrainingJob.objects.for_workspace(workspace).get()
    assert job.params["epochs"] == 2 and isinstance(job.params["epochs"], int)


def test_the_service_holds_the_limit_for_every_caller(workspace, dataset):
    """Pages and pipelines call the service, not the serializer: the limit is the service's."""
    from django.core.exceptions import ValidationError

    from training.services import job_create

    workspace_policy_set(actor=None, workspace=workspace, max_job_epochs=5)
    with pytest.raises(ValidationError) as refused:
        job_create(
            actor=None, workspace=workspace, name="long", dataset=dataset, template="logreg",
            params={"epochs": 6},
        )  # fmt: skip
    assert "params.epochs" in refused.value.message_dict
    assert not TrainingJob.objects.for_workspace(workspace).exists()
