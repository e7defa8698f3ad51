"""Concluding an experiment releases its winner without loading a model or applying a serving
backend under the experiment's row lock (issue 17): the release records serving's desired state
in the conclusion's transaction, and serving's controller warms the version and applies the
backend after the commit, outside any transaction."""

from __future__ import annotations

import pytest
from django.db import connection

from experiments import services
from experiments.tests.test_flow import _create
from serving import controllers
from serving.controllers import EmbeddedController, deployment_reconcile, deployment_status
from serving.inference import MODELS
from serving.models import Backend, Deployment
from serving.tests.helpers import deployed
from workspaces.models import Role


class RecordingEmbedded(EmbeddedController):
    """The real embedded controller, noting whether it ran inside a transaction."""

    def __init__(self) -> None:
        self.in_transaction: list[bool] = []

    def apply(self, dep):
        self.in_transaction.append(connection.in_atomic_block)
        return super().apply(dep)


@pytest.mark.django_db(transaction=True)
def test_promote_loads_nothing_in_the_transaction_and_the_controller_applies_after_it(
    workspace, members, monkeypatch
):
    dev, maintainer = members[Role.DEVELOPER], members[Role.MAINTAINER]
    _, (_, treatment), dep = deployed(workspace, maintainer, versions=2)
    recording = RecordingEmbedded()
    monkeypatch.setitem(controllers.CONTROLLERS, Backend.EMBEDDED, recording)
    deployment_reconcile(deployment_id=dep.pk)
    exp = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatment])
    )
    MODELS.clear()

    exp = services.experiment_conclude(actor=maintainer, experiment=exp, action="promote")

    assert exp.decision["version_id"] == treatment.pk
    dep = Deployment.objects.for_workspace(workspace).get(pk=dep.pk)
    assert dep.version_id == treatment.pk
    # The conclusion loaded no model (nothing is in this process's cache) and the status says
    # the new generation waits for the controller.
    assert treatment.pk not in MODELS.loaded_ids()
    assert deployment_status(dep)["phase"] == "Pending"
    assert recording.in_transaction == [False]

    assert deployment_reconcile(deployment_id=dep.pk) == "Ready"
    assert recording.in_transaction == [False, False]
    assert treatment.pk in MODELS.loaded_ids()
    dep = Deployment.objects.for_workspace(workspace).select_related("observed").get(pk=dep.pk)
    assert deployment_status(dep)["observed_generation"] == dep.generation == 2
    assert deployment_status(dep)["phase"] == "Ready"
