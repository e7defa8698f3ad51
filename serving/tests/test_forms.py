"""The serving pages' forms (Django test client): register a version from a succeeded job,
deploy a version, re-run its gates. Valid posts call the services and redirect; invalid ones
show the error next to the field and write nothing; roles below the one needed are refused."""

from __future__ import annotations

import pytest
from django.urls import reverse

from serving import registry
from serving.models import Deployment, ModelVersion
from serving.tests.factories import make_bundle, make_job, make_scene, make_spec
from serving.tests.helpers import passing_version
from workspaces.models import Role
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db


@pytest.fixture
def scene(workspace):
    return make_scene(workspace, None)


@pytest.fixture
def job(scene):
    return make_job(scene, make_bundle(make_spec(scene)), name="trained")


def _login(client, workspace, role):
    user = make_member(workspace, role)
    client.force_login(user)
    return user


def _register_url(workspace):
    return reverse("serving-version-register", kwargs={"ws": workspace.slug})


def test_register_form_registers_a_version_and_redirects(client, workspace, job):
    _login(client, workspace, Role.DEVELOPER)
    page = client.get(reverse("serving-models", kwargs={"ws": workspace.slug})).content.decode()
    assert 'data-testid="register-form"' in page and f"trained #{job.pk}" in page
    response = client.post(_register_url(workspace), {"job": str(job.pk), "model": "ranker"})
    version = ModelVersion.objects.for_workspace(workspace).get()
    assert response.status_code == 302
    assert response["Location"] == reverse(
        "serving-version", kwargs={"ws": workspace.slug, "name": "ranker", "version": 1}
    )
    assert (version.model.name, version.version, version.job_id) == ("ranker", 1, job.pk)


def test_register_form_errors_name_the_allowed_jobs_and_write_nothing(client, workspace, job):
    _login(client, workspace, Role.DEVELOPER)
    response = client.post(_register_url(workspace), {"job": "999999", "model": "ranker"})
    assert response.status_code == 400
    assert f"use one of: {job.pk}" in " ".join(response.context["register_form"].errors["job"])
    assert 'data-error-for="job"' in response.content.decode()
    response = client.post(_register_url(workspace), {"job": str(job.pk), "model": "Bad Name!"})
    assert response.status_code == 400
    assert response.context["register_form"].errors["model"]
    assert not ModelVersion.objects.for_workspace(workspace).exists()


def test_job_page_offers_registration_to_developers_only(client, workspace, job):
    url = reverse("training-job", kwargs={"ws": workspace.slug, "pk": job.pk})
    _login(client, workspace, Role.VIEWER)
    assert b'data-testid="register-version"' not in client.get(url).content
    _login(client, workspace, Role.DEVELOPER)
    assert b'data-testid="register-version"' in client.get(url).content


def test_viewer_cannot_register(client, workspace, job):
    _login(client, workspace, Role.VIEWER)
    page = client.get(reverse("serving-models", kwargs={"ws": workspace.slug})).content
    assert b'data-testid="register-form"' not in page
    response = client.post(_register_url(workspace), {"job": str(job.pk), "model": "ranker"})
    assert response.status_code == 403
    assert not ModelVersion.objects.for_workspace(workspace).exists()


def _version_url(version, action=""):
    name = f"serving-version-{action}" if action else "serving-version"
    return reverse(
        name,
        kwargs={
            "ws": version.workspace.slug,
            "name": version.model.name,
            "version": version.version,
        },
    )


def test_deploy_creates_a_deployment_then_releases_to_it(client, workspace, scene):
    first = passing_version(scene, None, seed=0)
    second = passing_version(scene, None, seed=1)
    _login(client, workspace, Role.MAINTAINER)
    assert b'data-testid="deploy-form"' in client.get(_version_url(first)).content
    response = client.post(_version_url(first, "deploy"), {"deployment": "main"})
    assert response.status_code == 302
    dep = Deployment.objects.for_workspace(workspace).get(name="main")
    assert dep.version == first
    response = client.post(_version_url(second, "deploy"), {"deployment": "main", "reason": "v2"})
    assert response.status_code == 302
    dep.refresh_from_db()
    assert (dep.version, dep.previous_version) == (second, first)


def test_deploy_of_an_ungated_version_shows_why_and_writes_nothing(client, workspace, job):
    version = registry.model_version_register(actor=None, workspace=workspace, name="r", job=job)
    _login(client, workspace, Role.MAINTAINER)
    response = client.post(_version_url(version, "deploy"), {"deployment": "main"})
    assert response.status_code == 400
    assert "has not passed the" in " ".join(response.context["deploy_form"].non_field_errors())
    response = client.post(_version_url(version, "deploy"), {"deployment": "Bad Name!"})
    assert response.status_code == 400
    assert response.context["deploy_form"].errors["deployment"]
    assert not Deployment.objects.for_workspace(workspace).exists()


def test_developer_cannot_deploy_or_rerun_gates(client, workspace, scene):
    version = passing_version(scene, None)
    gates = dict(version.gates)
    _login(client, workspace, Role.DEVELOPER)
    page = client.get(_version_url(version)).content
    assert b'data-testid="deploy-form"' not in page and b'data-testid="rerun-gates"' not in page
    assert client.post(_version_url(version, "deploy"), {"deployment": "main"}).status_code == 403
    assert client.post(_version_url(version, "gates")).status_code == 403
    assert not Deployment.objects.for_workspace(workspace).exists()
    version.refresh_from_db()
    assert version.gates == gates


def test_rerun_gates_queues_a_run_once(client, workspace, scene):
    version = passing_version(scene, None)
    _login(client, workspace, Role.MAINTAINER)
    response = client.post(_version_url(version, "gates"))
    assert response.status_code == 302
    version.refresh_from_db()
    assert version.gates["run"]["state"] == "queued"
    again = client.post(_version_url(version, "gates"), follow=True)
    assert "already queued" in again.content.decode()
    assert b'data-testid="gates-run"' in again.content
