"""Notebook servers as pods (NOTEBOOK_BACKEND=kubernetes): opened through the API, the server's
objects reach the cluster through the official client (a loopback API server stands in for a
cluster, which cannot run here: workspaces.testing.kube_api); the pod's phase is the server's
state; an idle stop (the pod Succeeded) and a stop by its member revoke the token and delete
everything but the member's claim."""

from __future__ import annotations

import json

import pytest
import yaml

from training import notebook_pods, notebooks
from training.models import NotebookServer, NotebookState
from workspaces.models import ApiToken, Role
from workspaces.testing.factories import make_member, make_workspace
from workspaces.testing.kube_api import fake_api_server

pytestmark = pytest.mark.django_db

NS = "nb-test"


@pytest.fixture
def cluster(tmp_path, settings):
    with fake_api_server() as server:
        settings.NOTEBOOK_BACKEND = "kubernetes"
        settings.NOTEBOOK_KUBECONFIG = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
        settings.NOTEBOOK_K8S_NAMESPACE = NS
        settings.NOTEBOOK_IMAGE = "registry.example/rankops:1.2"
        settings.NOTEBOOK_PUBLIC_URL = "https://rankops.example"
        settings.NOTEBOOK_PLATFORM_URL = "http://web.rankops.svc:8000"
        settings.NOTEBOOK_IDLE_TIMEOUT_S = 900
        yield server


def paths(name: str) -> dict[str, str]:
    return {
        "Secret": f"/api/v1/namespaces/{NS}/secrets/{name}",
        "Pod": f"/api/v1/namespaces/{NS}/pods/{name}",
        "Service": f"/api/v1/namespaces/{NS}/services/{name}",
        "Ingress": f"/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses/{name}",
    }


def running_pod() -> dict:
    return {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def test_open_applies_a_pod_of_its_own_with_a_narrowed_token_and_nothing_of_the_platform(
    cluster, client_for
):
    workspace = make_workspace(slug="nb-k8s")
    member = make_member(workspace, Role.DEVELOPER)
    api = client_for(member)
    base = f"/api/v1/workspaces/{workspace.slug}/notebooks/"

    opened = api.post(base, format="json")
    assert opened.status_code == 201, opened.content
    server = NotebookServer.objects.for_workspace(workspace).get(pk=opened.json()["id"])
    assert (server.backend, server.state, server.isolation) == ("kubernetes", "starting", "pod")
    name = f"nb-nb-k8s-{server.pk}"
    claim = f"nb-home-nb-k8s-{member.pk}"

    patches = [r for r in cluster.requests if r["method"] == "PATCH"]
    assert [p["path"] for p in patches] == [
        paths(name)["Secret"],
        f"/api/v1/namespaces/{NS}/persistentvolumeclaims/{claim}",
        paths(name)["Pod"],
        paths(name)["Service"],
        paths(name)["Ingress"],
    ]
    for p in patches:
        assert p["content_type"] == "application/apply-patch+yaml"
        assert p["query"]["fieldManager"] == ["rankops"]
    bodies = {p["body"]["kind"]: p["body"] for p in patches}

    # The Secret holds the kernels' API token (narrowed to this workspace), Jupyter's own token
    # and Jupyter's settings with the idle limit.
    secret = bodies["Secret"]["stringData"]
    token = ApiToken.objects.get(pk=server.api_token_id)
    assert token.revoked_at is None
    assert [w.slug for w in token.workspaces.all()] == [workspace.slug]
    assert secret["rankops-token"].startswith(token.prefix)
    assert secret["jupyter-token"] == server.secret
    config = json.loads(secret["jupyter_server_config.json"])
    assert config["ServerApp"]["shutdown_no_activity_timeout"] == 900
    assert config["MappingKernelManager"]["cull_idle_timeout"] == 900
    assert config["LabApp"]["news_url"] is None

    pod = bodies["Pod"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["image"] == "registry.example/rankops:1.2"
    assert f"--ServerApp.base_url=/notebooks/{server.pk}/" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    # Built, never copied: nothing of the platform's, the client's settings from the Secret.
    for secret_name in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "CELERY_BROKER_URL"):
        assert secret_name not in env
    assert env["RANKOPS_URL"]["value"] == "http://web.rankops.svc:8000"
    assert env["RANKOPS_WORKSPACE"]["value"] == workspace.slug
    assert env["RANKOPS_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": name,
        "key": "rankops-token",
    }
    assert env["PYTHONPATH"]["value"] == "/app/client"
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim
    # The Ingress routes the server's path to its Service.
    rule = bodies["Ingress"]["spec"]["rules"][0]["http"]["paths"][0]
    assert rule["path"] == f"/notebooks/{server.pk}/"
    assert rule["backend"]["service"]["name"] == name
    # The objects are the rendered template's, as they are.
    assert list(bodies.values()) == list(yaml.safe_load_all(_rendered(server, secret)))

    # Pending: still starting; ready: running, with the Ingress URL.
    body = api.get(f"{base}{server.pk}/").json()
    assert body["state"] == "starting"
    cluster.pod_status[paths(name)["Pod"]] = running_pod()
    body = api.get(f"{base}{server.pk}/").json()
    assert body["state"] == "running"
    assert body["url"] == (
        f"https://rankops.example/notebooks/{server.pk}/lab?token={server.secret}"
    )

    # Opening again gives the same server: nothing new is applied.
    before = len(cluster.paths("PATCH"))
    again = api.post(base, format="json")
    assert again.status_code == 200 and again.json()["id"] == server.pk
    assert len(cluster.paths("PATCH")) == before

    # The member stops it: the pod and its objects are deleted, the claim kept, token revoked.
    stopped = api.post(f"{base}{server.pk}/stop/", format="json")
    assert stopped.status_code == 200, stopped.content
    assert stopped.json()["state"] == "stopped"
    assert sorted(cluster.paths("DELETE")) == sorted(paths(name).values())
    assert f"/api/v1/namespaces/{NS}/persistentvolumeclaims/{claim}" in cluster.objects
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None


def _rendered(server: NotebookServer, secret: dict) -> str:
    return notebook_pods.render(
        server,
        key=secret["rankops-token"],
        platform_url="http://web.rankops.svc:8000",
        config=json.loads(secret["jupyter_server_config.json"]),
    )


def test_an_idle_pod_that_ended_marks_the_server_stopped_and_cleans_up(cluster):
    workspace = make_workspace(slug="nb-idle")
    member = make_member(workspace, Role.DEVELOPER)
    server, started = notebooks.notebook_open(
        actor=member, workspace=workspace, platform_url="http://x"
    )
    assert started
    name = notebook_pods.name(server)
    cluster.pod_status[paths(name)["Pod"]] = running_pod()
    assert notebooks.notebook_refresh(server).state == NotebookState.RUNNING

    # Jupyter stopped itself after its idle limit: the pod Succeeded.
    cluster.pod_status[paths(name)["Pod"]] = {
        "phase": "Succeeded",
        "containerStatuses": [
            {
                "name": "jupyterlab",
                "ready": False,
                "restartCount": 0,
                "image": "rankops",
                "imageID": "",
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
            }
        ],
    }
    server = notebooks.notebook_refresh(server)
    assert server.state == NotebookState.STOPPED
    assert (
        "idle for 900 s" in server.stop_reason and "exit code 0 (Completed)" in server.stop_reason
    )
    assert ApiToken.objects.get(pk=server.api_token_id).revoked_at is not None
    assert set(paths(name).values()) <= set(cluster.paths("DELETE"))
    assert not any(p in cluster.objects for p in paths(name).values())


def test_a_pod_that_failed_or_vanished_fails_the_server_saying_why(cluster):
    workspace = make_workspace(slug="nb-fail")
    member = make_member(workspace, Role.DEVELOPER)
    server, _ = notebooks.notebook_open(actor=member, workspace=workspace, platform_url="http://x")
    cluster.pod_status[paths(notebook_pods.name(server))["Pod"]] = {
        "phase": "Failed",
        "message": "The node was low on resource: memory.",
    }
    server = notebooks.notebook_refresh(server)
    assert server.state == NotebookState.FAILED
    assert server.stop_reason == "its pod failed (The node was low on resource: memory.)"

    other = make_member(workspace, Role.DEVELOPER)
    second, _ = notebooks.notebook_open(actor=other, workspace=workspace, platform_url="http://x")
    del cluster.objects[paths(notebook_pods.name(second))["Pod"]]  # deleted in the cluster
    second = notebooks.notebook_refresh(second)
    assert second.state == NotebookState.FAILED
    assert second.stop_reason == "its pod is gone from the cluster"


def test_without_a_cluster_the_server_fails_naming_the_setting(cluster, settings):
    settings.NOTEBOOK_KUBECONFIG = ""
    workspace = make_workspace(slug="nb-nocluster")
    member = make_member(workspace, Role.DEVELOPER)
    server, _ = notebooks.notebook_open(actor=member, workspace=workspace, platform_url="http://x")
    assert server.state == NotebookState.FAILED
    assert "no cluster configured (NOTEBOOK_KUBECONFIG)" in server.stop_reason
    assert ApiToken.objects.get(pk=server.api_token_id).revoked_at is not None
    assert cluster.requests == []


def test_an_unknown_backend_is_refused_naming_the_allowed_ones(settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.NOTEBOOK_BACKEND = "docker"
    with pytest.raises(ImproperlyConfigured, match="allowed: process, kubernetes"):
        notebooks.backend()
