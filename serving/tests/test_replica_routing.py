"""The gateway sends a deployment's traffic to its model-server replicas (``serving.replicas``):
once the local backend's replicas are Ready, every request's rows are scored there (the
replica's own statistics count them), with the same scores as in process; a version released
or rolled back is scored in process until its own replicas are Ready; a replica that dies
costs no request (the gateway scores it itself and counts the fallback)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from prometheus_client import REGISTRY

from serving.controllers import SUPERVISOR, deployment_reconcile
from serving.deployments import deployment_create, deployment_release, deployment_rollback
from serving.models import Backend, DeploymentStatus
from serving.routing import TABLES
from serving.tests.helpers import deployed, predict_body
from workspaces.models import Role
from workspaces.testing.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _ready(workspace, dep) -> DeploymentStatus:
    wait_until(
        lambda: deployment_reconcile(deployment_id=dep.pk) in ("Ready", "unchanged"),
        timeout=60,
        what="the replicas to answer ready",
        interval=0.2,
    )
    return DeploymentStatus.objects.for_workspace(workspace).get(deployment=dep)


def _stats(status: DeploymentStatus) -> dict:
    (url,) = status.detail["endpoints"]
    answer = httpx.get(f"{url}/v2/models/{status.detail['model']}/stats", timeout=5)
    assert answer.status_code == 200, answer.text
    return answer.json()["model_stats"][0]


def test_the_gateway_scores_a_deployments_rows_on_its_replicas(workspace, members, client_for):
    actor = members[Role.MAINTAINER]
    scene, (v1, v2), _ = deployed(workspace, actor)  # "main": v1, embedded (scored in process)
    client = client_for(members[Role.VIEWER])
    url = f"/api/v1/workspaces/{workspace.slug}/predict/"
    try:
        dep = deployment_create(
            actor=actor, workspace=workspace, name="local", version=v1, backend=Backend.LOCAL
        )
        status = _ready(workspace, dep)
        TABLES.force_refresh()
        answers = []
        for i in range(3):
            body = predict_body(scene, request_id=f"r-{i}", user=f"u{i}", deployment="local")
            response = client.post(url, body, format="json")
            assert response.status_code == 200, response.content
            assert response.json()["version"] == 1
            answers.append(response.json()["scores"])
        stats = _stats(status)
        assert stats["execution_count"] == 3 and stats["inference_count"] == 3 * 20
        # The same rows scored in the gateway's process (the embedded deployment of v1).
        for i, scores in enumerate(answers):
            body = predict_body(scene, request_id=f"e-{i}", user=f"u{i}", deployment="main")
            embedded = client.post(url, body, format="json").json()["scores"]
            assert np.allclose(scores, embedded, atol=1e-6)
        assert _stats(status)["execution_count"] == 3  # "main" never reached the replica

        # The gateway's Open Inference Protocol route sends the same deployment's rows there too.
        from serving.inference import MODELS
        from serving.model_server import synthetic_columns

        loaded = MODELS.get(v1.pk)
        columns = synthetic_columns(loaded.bundle.spec, 7)
        infer = {
            "inputs": [
                {**meta, "shape": [7, *meta["shape"][1:]], "data": columns[meta["name"]]}
                for meta in loaded.oip_inputs
            ]
        }
        oip_url = f"/v2/models/{workspace.slug}.local/infer"
        response = client.post(oip_url, infer, format="json")
        assert response.status_code == 200, response.content
        assert np.allclose(
            response.json()["outputs"][0]["data"], loaded.predict(columns, 7), atol=1e-6
        )
        assert _stats(status)["execution_count"] == 4 and _stats(status)["inference_count"] == 67

        # A replica that died costs no request: the gateway scores it and counts the fallback.
        labels = {"workspace": workspace.slug, "deployment": "local"}
        before = REGISTRY.get_sample_value("rankops_replica_fallbacks_total", labels) or 0.0
        SUPERVISOR.procs[dep.pk][0]["proc"].kill()
        SUPERVISOR.procs[dep.pk][0]["proc"].wait()
        body = predict_body(scene, request_id="r-dead", user="u0", deployment="local")
        response = client.post(url, body, format="json")
        assert response.status_code == 200, response.content
        assert np.allclose(response.json()["scores"], answers[0], atol=1e-6)
        assert REGISTRY.get_sample_value("rankops_replica_fallbacks_total", labels) == before + 1

        # A release moves traffic to v2 at once (in process), then onto v2's replicas.
        dep = deployment_release(actor=actor, workspace=workspace, deployment=dep, version=v2)
        TABLES.force_refresh()
        body = predict_body(scene, request_id="r-v2", user="u0", deployment="local")
        assert client.post(url, body, format="json").json()["version"] == 2
        status = _ready(workspace, dep)
        TABLES.force_refresh()
        assert client.post(url, body, format="json").json()["version"] == 2
        assert _stats(status)["execution_count"] == 1
        assert status.detail["endpoints"] and _stats(status)["version"] == "2"

        # A rollback switches traffic back to v1 before any replica of it is up again.
        dep = deployment_rollback(actor=actor, workspace=workspace, deployment=dep, reason="test")
        TABLES.force_refresh()
        response = client.post(url, body, format="json")
        assert response.json()["version"] == 1
        assert np.allclose(response.json()["scores"], answers[0], atol=1e-6)
    finally:
        SUPERVISOR.stop_all()


@pytest.mark.one_backend  # a manifest and a process: the database changes nothing here
def test_a_gpu_deployment_loads_its_model_on_cuda_where_there_is_one(workspace, members):
    import json
    import subprocess
    import sys

    import torch

    from serving import artifacts
    from serving.controllers import free_port, render_manifest

    actor = members[Role.MAINTAINER]
    _, (v1,), _ = deployed(workspace, actor, versions=1)
    dep = deployment_create(
        actor=actor,
        workspace=workspace,
        name="gpu",
        version=v1,
        backend=Backend.KUBERNETES,
        device="gpu",
    )
    manifest = render_manifest(dep)
    assert '"--device", "cuda"' in manifest and '"--host", "0.0.0.0"' in manifest
    cpu = deployment_create(
        actor=actor, workspace=workspace, name="cpu", version=v1, backend=Backend.KUBERNETES
    )
    assert '"--device", "cpu"' in render_manifest(cpu)
    # The server itself: on CUDA where the machine has a GPU, else on the CPU, and says which.
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "serving.model_server", "serve"),
            *("--path", str(artifacts.resolve_artifact(v1.artifact_path))),
            *("--port", str(free_port()), "--device", "cuda"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        started = json.loads(server.stdout.readline())
    finally:
        server.kill()
        server.wait()
    assert started["ready"] is True
    assert started["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
