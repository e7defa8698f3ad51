"""The admin shows versions and deployments but never writes them: a version becomes deployable
only through its gates, a deployment moves only through the deployment services."""

from __future__ import annotations

import pytest
from django.test import Client

from experiments.tests.factories import make_deployment, make_model, make_version
from serving.models import GateStatus
from workspaces.testing.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff():
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


def test_a_version_cannot_be_marked_deployable_in_the_admin(staff, workspace):
    version = make_version(workspace, make_model(workspace), gated=False)
    url = f"/admin/serving/modelversion/{version.pk}/change/"
    page = staff.get(url)
    assert page.status_code == 200
    assert b'name="_save"' not in page.content and b'name="gate_status"' not in page.content
    forged = {"gate_status": GateStatus.PASSED, "gates": '{"consistency": {"status": "passed"}}'}
    assert staff.post(url, forged).status_code == 403
    assert staff.post("/admin/serving/modelversion/add/", forged).status_code == 403
    version.refresh_from_db()
    assert (version.gate_status, version.gates) == (GateStatus.PENDING, {})


def test_a_deployment_cannot_be_moved_or_deleted_in_the_admin(staff, workspace):
    dep, (other,) = make_deployment(workspace)
    production = dep.version_id
    url = f"/admin/serving/deployment/{dep.pk}/change/"
    assert staff.post(url, {"version": other.pk, "replicas": 9}).status_code == 403
    assert (
        staff.post(f"/admin/serving/deployment/{dep.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    dep.refresh_from_db()
    assert (dep.version_id, dep.replicas) != (other.pk, 9)
    assert dep.version_id == production
