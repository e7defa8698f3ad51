"""An experiment's state and decision move only through the experiment services: the admin
shows them read-only and refuses a change form POST."""

from __future__ import annotations

import pytest
from django.test import Client

from experiments import services
from experiments.models import Experiment, ExperimentState
from experiments.tests.factories import make_deployment
from workspaces.models import Role
from workspaces.testing.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_experiment_state_and_decision_are_read_only_in_the_admin(workspace, members):
    dep, versions = make_deployment(workspace)
    owner = members[Role.MAINTAINER]
    layer = services.layer_create(actor=owner, workspace=workspace, name="l", salt="admin-test")
    exp = services.experiment_create(
        actor=owner,
        workspace=workspace,
        key="ab-admin",
        hypothesis="h",
        deployment=dep.name,
        treatment_versions=[v.pk for v in versions],
        layer=layer,
    )
    state = exp.state
    staff = Client()
    staff.force_login(UserFactory(is_staff=True, is_superuser=True))
    url = f"/admin/experiments/experiment/{exp.pk}/change/"
    page = staff.get(url)
    assert page.status_code == 200
    assert b'name="_save"' not in page.content and b'name="state"' not in page.content
    forged = {"state": ExperimentState.CONCLUDED, "decision": '{"winner": "treatment"}'}
    assert staff.post(url, forged).status_code == 403
    salt = f"/admin/experiments/layer/{layer.pk}/change/"
    assert staff.post(salt, {"salt": "other"}).status_code == 403
    exp = Experiment.objects.for_workspace(workspace).get(pk=exp.pk)
    assert (exp.state, exp.decision) == (state, {})
    layer.refresh_from_db()
    assert layer.salt == "admin-test"
