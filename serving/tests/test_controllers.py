"""Deployment controllers (issue 17, item 3): the services write the desired state, the
backend's controller makes it so outside any transaction and reports a status; reconciling a
converged deployment does nothing new; a failure is Failed with its message and the resync
retries; a report about an older generation is never Ready; the API answers 202 with the status
to follow. The Kubernetes controller talks to a small API server on the loopback that speaks the
endpoints it uses (server-side apply and read of Deployments and Services)."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction

from config.celery import app
from serving import artifacts, controllers
from serving.controllers import (
    ControllerInTransactionError,
    EmbeddedController,
    deployment_reconcile,
    deployment_status,
    manifest_objects,
    render_manifest,
)
from serving.deployments import (
    deployment_create,
    deployment_release,
    deployment_rollback,
    deployment_scale,
    deployment_stop,
)
from serving.inference import MODELS
from serving.models import Backend, Deployment, DeploymentPhase, DeploymentStatus
from serving.tasks import deployments_reconcile
from serving.tests.helpers import deployed
from workspaces.models import Role
from workspaces.testing.kube_api import fake_api_server
from workspaces.testing.waiting import wait_until
from workspaces.testing.workers import embedded_worker

pytestmark = pytest.mark.django_db(transaction=True)


def _status(dep) -> DeploymentStatus:
    return DeploymentStatus.objects.for_workspace(dep.workspace_id).get(deployment_id=dep.pk)


def _fresh(dep) -> Deployment:
    return (
        Deployment.objects.for_workspace(dep.workspace_id)
        .select_related("observed", "version")
        .get(pk=dep.pk)
    )


# ---------------------------------------------------------------------------------------------
# Embedded


def test_a_desired_state_change_is_reconciled_to_ready_and_a_second_pass_does_nothing(
    workspace, members
):
    actor = members[Role.MAINTAINER]
    _, (v1, v2), dep = deployed(workspace, actor)
    # The request loaded nothing: the controller warms.
    assert v1.pk not in MODELS.loaded_ids()
    assert deployment_status(_fresh(dep))["phase"] == DeploymentPhase.PENDING

    assert deployment_reconcile(deployment_id=dep.pk) == DeploymentPhase.READY
    status = _status(dep)
    assert (status.phase, status.observed_generation, status.ready_replicas) == ("Ready", 1, 1)
    assert status.detail == {"embedded": True, "warm": [v1.pk]}
    assert v1.pk in MODELS.loaded_ids()
    first_transition = status.last_transition_at
    assert first_transition is not None

    # Idempotent: nothing is loaded, written or moved by a second pass.
    MODELS.clear()
    assert deployment_reconcile(deployment_id=dep.pk) == "unchanged"
    assert MODELS.loaded_ids() == []
    again = _status(dep)
    assert (again.reconciled_at, again.last_transition_at) == (
        status.reconciled_at,
        first_transition,
    )

    # A release is generation 2: Pending (not the old Ready) until the controller takes it up.
    deployment_release(actor=actor, workspace=workspace, deployment=dep, version=v2)
    shown = deployment_status(_fresh(dep))
    assert (shown["phase"], shown["generation"], shown["observed_generation"]) == (
        "Pending",
        2,
        1,
    )
    assert shown["ready_replicas"] == 0 and "generation 2" in shown["message"]
    assert deployment_reconcile(deployment_id=dep.pk) == DeploymentPhase.READY
    status = _status(dep)
    assert status.observed_generation == 2
    # Production and the rollback target, which stays loaded.
    assert status.detail["warm"] == [v2.pk, v1.pk]
    assert {v1.pk, v2.pk} <= set(MODELS.loaded_ids())

    deployment_rollback(actor=actor, workspace=workspace, deployment=dep, reason="dirty")
    assert deployment_status(_fresh(dep))["phase"] == "Pending"
    assert deployments_reconcile() == {DeploymentPhase.READY: 1}
    assert deployments_reconcile() == {}  # converged embedded deployments are left alone
    assert _status(dep).observed_generation == 3


def test_a_failing_backend_is_failed_with_its_message_and_the_resync_retries(workspace, members):
    actor = members[Role.MAINTAINER]
    _, (v1,), dep = deployed(workspace, actor, versions=1)
    bundle = artifacts.resolve_artifact(v1.artifact_path)
    away = bundle.with_name(bundle.name + ".away")
    bundle.rename(away)
    try:
        assert deployment_reconcile(deployment_id=dep.pk) == DeploymentPhase.FAILED
        status = _status(dep)
        assert status.phase == "Failed" and status.failures == 1
        assert status.message == "ValidationError: not a model bundle directory", status.message
        shown = deployment_status(_fresh(dep))
        assert shown["phase"] == "Failed" and shown["message"] == status.message
        # The resync retries a failed deployment (and it still fails while the bundle is away).
        assert deployments_reconcile() == {DeploymentPhase.FAILED: 1}
        assert _status(dep).failures == 2
    finally:
        away.rename(bundle)
    assert deployments_reconcile() == {DeploymentPhase.READY: 1}
    status = _status(dep)
    assert (status.phase, status.failures, status.message) == ("Ready", 0, "")


class ScalingDuringApply(EmbeddedController):
    """The real embedded controller, while someone scales the deployment in the middle of the
    apply (the request's transaction commits while the controller works)."""

    def __init__(self, actor) -> None:
        self.actor = actor
        self.seen_in_transaction: list[bool] = []

    def apply(self, dep):
        self.seen_in_transaction.append(connection.in_atomic_block)
        if dep.generation == 1:
            deployment_scale(actor=self.actor, workspace=dep.workspace, deployment=dep, replicas=3)
        return super().apply(dep)


def test_a_report_about_an_older_generation_is_never_ready(workspace, members, monkeypatch):
    actor = members[Role.MAINTAINER]
    _, _, dep = deployed(workspace, actor, versions=1)
    racing = ScalingDuringApply(actor)
    monkeypatch.setitem(controllers.CONTROLLERS, Backend.EMBEDDED, racing)

    assert deployment_reconcile(deployment_id=dep.pk) == DeploymentPhase.READY
    status = _status(dep)
    assert status.phase == "Ready" and status.observed_generation == 1
    shown = deployment_status(_fresh(dep))
    assert shown["generation"] == 2 and shown["phase"] == "Pending"
    assert shown["desired_replicas"] == 3 and shown["ready_replicas"] == 0

    assert deployment_reconcile(deployment_id=dep.pk) == DeploymentPhase.READY
    shown = deployment_status(_fresh(dep))
    assert (shown["phase"], shown["observed_generation"], shown["ready_replicas"]) == (
        "Ready",
        2,
        3,
    )
    # The backend work ran outside any transaction, both times.
    assert racing.seen_in_transaction == [False, False]


def test_controllers_refuse_to_run_inside_a_transaction(workspace, members):
    _, _, dep = deployed(workspace, members[Role.MAINTAINER], versions=1)
    with transaction.atomic(), pytest.raises(ControllerInTransactionError):
        deployment_reconcile(deployment_id=dep.pk)
    assert _status(dep).phase == "Pending"
    assert deployment_reconcile(deployment_id=10**9) == "gone"


def test_stop_is_a_desired_state_the_controller_reaches(workspace, members):
    actor = members[Role.MAINTAINER]
    _, _, dep = deployed(workspace, actor, versions=1)
    deployment_reconcile(deployment_id=dep.pk)
    deployment_stop(actor=actor, workspace=workspace, deployment=dep, reason="done")
    assert deployment_status(_fresh(dep))["desired_replicas"] == 0
    assert deployment_reconcile(deployment_id=dep.pk) == DeploymentPhase.STOPPED
    assert deployment_reconcile(deployment_id=dep.pk) == "unchanged"
    assert deployment_status(_fresh(dep))["phase"] == "Stopped"


# ---------------------------------------------------------------------------------------------
# The API and the page


def test_the_api_answers_202_with_the_status_to_follow(workspace, members, client_for):
    actor = members[Role.MAINTAINER]
    _, (v1, v2), _ = deployed(workspace, actor, name="seed")
    client = client_for(actor)
    base = f"/api/v1/workspaces/{workspace.slug}/deployments/"

    created = client.post(base, {"name": "api", "version_id": v1.pk}, format="json")
    assert created.status_code == 202, created.content
    location = created["Location"]
    assert location.endswith(f"{base}api/")
    body = created.json()
    assert body["generation"] == 1 and body["status"]["phase"] == "Pending"
    assert body["status"]["observed_generation"] == 0

    # The page polls the status while it is Pending, and stops once it is Ready.
    browser = client_for(None)
    browser.force_login(members[Role.VIEWER])
    fragment_url = f"/w/{workspace.slug}/deployments/api/status/"
    page = browser.get(f"/w/{workspace.slug}/deployments/api/").content.decode()
    assert f'hx-get="{fragment_url}"' in page and 'data-phase="Pending"' in page

    dep = Deployment.objects.for_workspace(workspace).get(name="api")
    deployment_reconcile(deployment_id=dep.pk)
    fragment = browser.get(fragment_url).content.decode()
    assert 'data-phase="Ready"' in fragment and "hx-get" not in fragment
    assert "1 of 1 replica(s) ready" in fragment
    assert browser.get(f"/w/{workspace.slug}/deployments/nope/status/").status_code == 404
    polled = client.get(location)
    assert polled.status_code == 200
    assert polled.json()["status"]["phase"] == "Ready"
    assert polled.json()["status"]["ready_replicas"] == 1

    released = client.post(f"{base}api/release/", {"version_id": v2.pk}, format="json")
    assert released.status_code == 202, released.content
    assert released["Location"] == location
    assert released.json()["status"]["phase"] == "Pending"
    assert released.json()["version"] == v2.version
    scaled = client.post(f"{base}api/scale/", {"replicas": 2}, format="json")
    assert scaled.status_code == 202 and scaled.json()["generation"] == 3
    rolled = client.post(f"{base}api/rollback/", {"reason": "api test"}, format="json")
    assert rolled.status_code == 202 and rolled.json()["version"] == v1.version
    stopped = client.post(f"{base}api/stop/", {"reason": "api test"}, format="json")
    assert stopped.status_code == 202, stopped.content
    assert stopped.json()["state"] == "stopped" and stopped.json()["generation"] == 5

    deployment_reconcile(deployment_id=dep.pk)
    assert client.get(location).json()["status"]["phase"] == "Stopped"

    # The page shows the phase too.
    page = browser.get(f"/w/{workspace.slug}/deployments/api/").content.decode()
    assert 'data-testid="deployment-phase"' in page and "Stopped" in page
    listing = browser.get(f"/w/{workspace.slug}/deployments/").content.decode()
    assert 'data-testid="phase"' in listing and "Pending" in listing  # "seed", never reconciled


# ---------------------------------------------------------------------------------------------
# A real Celery worker


@pytest.mark.celery_worker
def test_a_real_worker_reconciles_after_the_commit(workspace, members, settings):
    settings.SERVING_CONTROLLER_QUEUE = f"test-{uuid.uuid4().hex[:12]}"  # nobody else reads it
    actor = members[Role.MAINTAINER]
    with embedded_worker([settings.SERVING_CONTROLLER_QUEUE]):
        _, (v1, v2), dep = deployed(workspace, actor)  # the task is enqueued at the commit
        wait_until(
            lambda: deployment_status(_fresh(dep))["phase"] == "Ready",
            timeout=60,
            what="the worker to reconcile the new deployment",
            interval=0.1,
        )
        deployment_release(actor=actor, workspace=workspace, deployment=dep, version=v2)
        wait_until(
            lambda: deployment_status(_fresh(dep))["observed_generation"] == 2,
            timeout=60,
            what="the worker to reconcile the release",
            interval=0.1,
        )
    assert deployment_status(_fresh(dep))["phase"] == "Ready"
    assert _status(dep).detail["warm"] == [v2.pk, v1.pk]


def test_the_beat_runs_the_resync():
    entry = django_settings.CELERY_BEAT_SCHEDULE["serving-deployments-reconcile"]
    assert entry["task"] == deployments_reconcile.name and entry["task"] in app.tasks
    assert "serving.deployment_reconcile" in app.tasks


# ---------------------------------------------------------------------------------------------
# Kubernetes, against a loopback API server


@pytest.fixture
def fake_cluster(tmp_path, settings):
    with fake_api_server() as server:
        settings.SERVING_KUBECONFIG = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
        settings.SERVING_K8S_NAMESPACE = "serving-test"
        yield server


def test_the_kubernetes_controller_applies_with_the_client_and_follows_the_rollout(
    workspace, members, fake_cluster
):
    actor = members[Role.MAINTAINER]
    _, (v1, v2), main = deployed(workspace, actor)
    deployment_reconcile(deployment_id=main.pk)  # the embedded one, out of the resync's way
    dep = deployment_create(
        actor=actor,
        workspace=workspace,
        name="on-k8s",
        version=v1,
        backend=Backend.KUBERNETES,
        replicas=2,
    )
    assert fake_cluster.requests == []  # nothing reached the cluster from the request

    assert deployment_reconcile(deployment_id=dep.pk) == DeploymentPhase.PROGRESSING
    patches = [r for r in fake_cluster.requests if r["method"] == "PATCH"]
    name = f"ms-{workspace.slug}-on-k8s"
    assert [p["path"] for p in patches] == [
        f"/apis/apps/v1/namespaces/serving-test/deployments/{name}",
        f"/api/v1/namespaces/serving-test/services/{name}",
    ]
    for p in patches:
        assert p["content_type"] == "application/apply-patch+yaml"
        # The client writes force=True; the API server parses it as Go's ParseBool does.
        assert p["query"]["fieldManager"] == ["rankops"]
        assert [v.lower() for v in p["query"]["force"]] == ["true"]
    # The bodies are the rendered template's objects, as they are.
    fresh = _fresh(dep)
    assert [p["body"] for p in patches] == manifest_objects(render_manifest(fresh))
    deployment_body = patches[0]["body"]
    assert deployment_body["spec"]["replicas"] == 2
    assert deployment_body["spec"]["template"]["metadata"]["labels"][
        "rankops.io/version-id"
    ] == str(v1.pk)
    container = deployment_body["spec"]["template"]["spec"]["containers"][0]
    assert f"/artifacts/{v1.artifact_path}" in container["args"]
    status = _status(dep)
    assert status.message == "0 of 2 replicas ready in the cluster"
    assert status.manifest == render_manifest(fresh)

    fake_cluster.rolled_out = True
    assert deployment_reconcile(deployment_id=dep.pk) == DeploymentPhase.READY
    assert _status(dep).ready_replicas == 2
    # Converged: the next pass only reads the Deployment back.
    fake_cluster.requests.clear()
    assert deployment_reconcile(deployment_id=dep.pk) == "unchanged"
    assert [r["method"] for r in fake_cluster.requests] == ["GET"]

    # Someone deleted it in the cluster: the resync applies it again.
    del fake_cluster.objects[patches[0]["path"]]
    assert deployments_reconcile().get(DeploymentPhase.READY) == 1
    assert patches[0]["path"] in fake_cluster.objects

    # A release changes the pod template: a new cluster generation, rolled out again.
    fake_cluster.rolled_out = False
    deployment_release(actor=actor, workspace=workspace, deployment=dep, version=v2)
    assert deployment_reconcile(deployment_id=dep.pk) == DeploymentPhase.PROGRESSING
    live = fake_cluster.objects[patches[0]["path"]]
    assert live["metadata"]["generation"] == 2
    assert live["spec"]["template"]["metadata"]["labels"]["rankops.io/version-id"] == str(v2.pk)

    # Stop deletes the Deployment and the Service (not zero replicas left behind), once.
    deployment_stop(actor=actor, workspace=workspace, deployment=dep)
    assert deployment_reconcile(deployment_id=dep.pk) == DeploymentPhase.STOPPED
    assert {p["path"] for p in patches}.isdisjoint(fake_cluster.objects)
    assert [r["method"] for r in fake_cluster.requests if r["method"] == "DELETE"] == ["DELETE"] * 2
    assert _status(dep).detail["deleted"] == ["Deployment", "Service"]
    fake_cluster.requests.clear()
    assert deployment_reconcile(deployment_id=dep.pk) == "unchanged"
    assert [r["method"] for r in fake_cluster.requests] == ["GET"]


def test_the_kubernetes_controller_without_a_cluster_fails_with_the_reason(
    workspace, members, settings
):
    settings.SERVING_KUBECONFIG = ""
    actor = members[Role.MAINTAINER]
    _, (v1,), _ = deployed(workspace, actor, versions=1)
    dep = deployment_create(
        actor=actor, workspace=workspace, name="nok8s", version=v1, backend=Backend.KUBERNETES
    )
    assert deployment_reconcile(deployment_id=dep.pk) == DeploymentPhase.FAILED
    assert "no cluster configured (SERVING_KUBECONFIG)" in _status(dep).message
