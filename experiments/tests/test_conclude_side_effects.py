"""Concluding an experiment releases its winner without loading a model or applying a serving
backend under the experiment's row lock (issue 17): the version is warmed before the lock, the
backend applied after the commit."""

from __future__ import annotations

import pytest
from django.db import connection

from experiments import services
from experiments.tests.test_flow import _create
from serving import deployments
from serving.tests.helpers import deployed
from workspaces.models import Role


@pytest.mark.django_db(transaction=True)
def test_promote_warms_before_the_lock_and_applies_the_backend_after_the_commit(
    workspace, members, monkeypatch
):
    dev, maintainer = members[Role.DEVELOPER], members[Role.MAINTAINER]
    _, (_, treatment), dep = deployed(workspace, maintainer, versions=2)
    exp = services.experiment_submit(
        actor=dev, experiment=_create(workspace, dev, dep, [treatment])
    )
    calls: list[tuple[str, bool]] = []
    warm, apply = deployments._warm, deployments._apply_backend

    def recording_warm(version):
        calls.append(("warm", connection.in_atomic_block))
        return warm(version)

    def recording_apply(dep, replicas=None):
        calls.append(("apply", connection.in_atomic_block))
        return apply(dep, replicas)

    monkeypatch.setattr(deployments, "_warm", recording_warm)
    monkeypatch.setattr(deployments, "_apply_backend", recording_apply)

    exp = services.experiment_conclude(actor=maintainer, experiment=exp, action="promote")

    assert exp.decision["version_id"] == treatment.pk
    dep.refresh_from_db()
    assert dep.version_id == treatment.pk and dep.status_detail == {"embedded": True}
    assert ("warm", False) in calls and ("apply", False) in calls
    # Whatever ran inside the transaction found the model warm already: no load under a lock.
    assert all(kind == "warm" for kind, locked in calls if locked)
    from serving.inference import MODELS

    assert MODELS.get(treatment.pk) is not None
