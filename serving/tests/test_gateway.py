"""The gateway: predict (features fetched by the gateway, one batch), routing with experiments,
the prediction log, OIP v2, /metrics, the UI pages and bad inputs."""

import os
from pathlib import Path

import numpy as np
import pytest
from django.core.exceptions import ValidationError

from features.lookup import online_lookup
from serving import routing
from serving.controllers import deployment_status, render_manifest
from serving.deployments import deployment_release, deployment_scale
from serving.inference import MODELS
from serving.models import Backend, PredictionLog
from serving.predlog import predlog_flush
from serving.routing import TABLES, bucket, route, routing_experiment_clear, routing_experiment_set
from serving.tests.helpers import deployed, predict_body
from training import sandbox
from workspaces.exceptions import ConflictError
from workspaces.models import Event, Role
from workspaces.testing.waiting import wait_until


def test_bucket_is_deterministic_and_uniform():
    assert bucket("u1", "salt") == bucket("u1", "salt")
    # Fixed by the algorithm (blake2b), so the same on every process and after restarts.
    assert (
        bucket("u1", "salt")
        == int.from_bytes(__import__("hashlib").blake2b(b"salt:u1", digest_size=8).digest(), "big")
        % 10000
    )
    counts = np.bincount([bucket(f"user-{i}", "s", 10) for i in range(20000)], minlength=10)
    assert counts.min() > 1800 and counts.max() < 2200


def test_route_picks_at_most_one_allocation_per_layer_and_production_outside():
    table = {
        "production": 1,
        "buckets": 10000,
        "layers": [
            {
                "layer": "a",
                "salt": "s1",
                "allocations": [
                    {
                        "experiment_key": "e1",
                        "arm": "control",
                        "version_id": 1,
                        "start": 0,
                        "end": 2500,
                    },
                    {
                        "experiment_key": "e1",
                        "arm": "treatment",
                        "version_id": 2,
                        "start": 2500,
                        "end": 5000,
                    },
                ],
            },
        ],
    }
    seen = {}
    for i in range(4000):
        unit = f"u{i}"
        version, experiment, arm = route(table, unit)
        b = bucket(unit, "s1")
        if b < 2500:
            assert (version, experiment, arm) == (1, "e1", "control")
        elif b < 5000:
            assert (version, experiment, arm) == (2, "e1", "treatment")
        else:
            assert (version, experiment, arm) == (1, None, None)
        seen[arm] = seen.get(arm, 0) + 1
    assert set(seen) == {"control", "treatment", None}


@pytest.mark.django_db
def test_predict_routes_experiments_logs_and_applies_table_changes(
    workspace, members, client_for, django_capture_on_commit_callbacks
):
    actor = members[Role.MAINTAINER]
    scene, (v1, v2), dep = deployed(workspace, actor)
    client = client_for(members[Role.VIEWER])
    url = f"/api/v1/workspaces/{workspace.slug}/predict/"

    response = client.post(url, predict_body(scene, request_id="r-0"), format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["version"] == 1 and body["experiment"] is None and len(body["scores"]) == 20
    # The gateway's scores equal the model applied to the online store's values.
    loaded = MODELS.get(v1.pk)
    users = online_lookup(
        workspace=workspace, entities=["u1"], features=loaded.plan.lookups["user"]
    )
    items = online_lookup(
        workspace=workspace, entities=scene.item_ids, features=loaded.plan.lookups["item"]
    )
    columns = {ref: [users["rows"][0][i]] * 20 for i, ref in enumerate(users["features"])}
    columns.update(
        {ref: [row[i] for row in items["rows"]] for i, ref in enumerate(items["features"])}
    )
    assert np.allclose(body["scores"], loaded.bundle.predict(columns, 20), atol=1e-9)

    with django_capture_on_commit_callbacks(execute=True):
        routing_experiment_set(
            actor=actor,
            workspace=workspace,
            deployment="main",
            experiment_key="exp-1",
            layer="ranking",
            salt="exp-1-salt",
            allocations=[
                {"arm": "control", "version_id": v1.pk, "start": 0, "end": 5000},
                {"arm": "treatment", "version_id": v2.pk, "start": 5000, "end": 10000},
            ],
        )
    with pytest.raises(ConflictError):
        routing_experiment_set(
            actor=actor,
            workspace=workspace,
            deployment="main",
            experiment_key="exp-2",
            layer="ranking",
            salt="exp-1-salt",
            allocations=[{"arm": "t", "version_id": v2.pk, "start": 4000, "end": 6000}],
        )
    with pytest.raises(ValidationError):
        routing_experiment_set(
            actor=actor,
            workspace=workspace,
            deployment="main",
            experiment_key="exp-3",
            layer="other",
            salt="s",
            allocations=[{"arm": "t", "version_id": v2.pk, "start": 5, "end": 2}],
        )
    # No wait: the commit bumped the shared generation and forced this process's next poll
    # (routing.publish), so the next request reads the new table.
    arms = {}
    for i in range(40):
        user = f"u{i % 12}"
        r = client.post(url, predict_body(scene, request_id=f"r-{i + 1}", user=user), format="json")
        assert r.status_code == 200
        b = r.json()
        expected_arm = "control" if bucket(user, "exp-1-salt") < 5000 else "treatment"
        assert (b["experiment"], b["arm"]) == ("exp-1", expected_arm)
        assert b["version"] == (1 if expected_arm == "control" else 2)
        arms[expected_arm] = arms.get(expected_arm, 0) + 1
    assert set(arms) == {"control", "treatment"}

    predlog_flush()
    logs = PredictionLog.objects.for_workspace(workspace)
    assert logs.count() == 41
    row = logs.get(request_id="r-1")
    assert row.experiment_key == "exp-1" and row.n_candidates == 20 and row.unit_id == "u0"
    assert row.deployment == dep and row.latency_ms > 0

    with django_capture_on_commit_callbacks(execute=True):
        assert routing_experiment_clear(
            actor=actor,
            workspace=workspace,
            deployment="main",
            experiment_key="exp-1",
            reason="done",
        )
    r = client.post(url, predict_body(scene, request_id="r-after"), format="json")
    assert r.json()["experiment"] is None and r.json()["version"] == 1
    verbs = set(Event.objects.filter(workspace=workspace).values_list("verb", flat=True))
    assert {"serving.routing.experiment_set", "serving.routing.experiment_cleared"} <= verbs

    # OIP v2 on the same deployment, workspace-qualified name.
    name = f"{workspace.slug}.main"
    meta = client.get(f"/v2/models/{name}")
    assert meta.status_code == 200 and meta.json()["inputs"]
    inputs = [
        {
            "name": f["name"],
            "datatype": f["datatype"],
            "shape": [20],
            "data": [
                str(columns[ref][k]) if f["datatype"] == "BYTES" else columns[ref][k]
                for k in range(20)
            ],
        }
        for f, ref in zip(
            meta.json()["inputs"], [s.ref for s in loaded.bundle.spec.features], strict=True
        )
    ]
    r = client.post(f"/v2/models/{name}/infer", {"id": "x", "inputs": inputs}, format="json")
    assert r.status_code == 200, r.content
    assert np.allclose(r.json()["outputs"][0]["data"], body["scores"], atol=1e-6)
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").json() == {"ready": True}
    bad = client.post(
        f"/v2/models/{name}/infer",
        {"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "data": [1]}]},
        format="json",
    )
    assert bad.status_code == 400
    assert client_for(None).post(f"/v2/models/{name}/infer", {}, format="json").status_code == 401
    assert client.get(f"/v2/models/{workspace.slug}.nope").status_code == 404

    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert b'rankops_serving_requests_total{deployment="main"' in metrics.content
    assert b"rankops_serving_latency_seconds_bucket" in metrics.content

    # UI: deployments page with charts data and the rollback button.
    client.force_login(actor)
    deployment_release(actor=actor, workspace=workspace, deployment=dep, version=v2, reason="x")
    page = client.get(f"/w/{workspace.slug}/deployments/main/")
    assert page.status_code == 200
    assert b'data-chart="qps"' in page.content and b"Roll back to v1" in page.content
    assert b'"version_mix"' in page.content
    done = client.post(f"/w/{workspace.slug}/deployments/main/", {"reason": "bad clicks"})
    assert done.status_code == 302
    dep.refresh_from_db()
    assert dep.version == v1
    for path in ("models/", "deployments/"):
        assert client.get(f"/w/{workspace.slug}/{path}").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"deployment": "main", "user": "u1", "candidates": []}, 400),
        ({"deployment": "main", "user": "u1", "candidates": ["i"] * 1001}, 400),
        ({"deployment": "main", "user": None, "candidates": ["i1"]}, 400),
        ({"deployment": "main", "user": True, "candidates": ["i1"]}, 400),
        ({"deployment": "main", "user": "u1", "candidates": [[1]]}, 400),
        ({"deployment": "main", "user": "u1", "candidates": ["i1"], "request_id": 5}, 400),
        ({"deployment": "nope", "user": "u1", "candidates": ["i1"]}, 404),
        ([1, 2], 400),
    ],
)
def test_predict_refuses_bad_bodies(workspace, members, client_for, body, status):
    deployed(workspace, members[Role.MAINTAINER], versions=1)
    client = client_for(members[Role.VIEWER])
    url = f"/api/v1/workspaces/{workspace.slug}/predict/"
    response = client.post(url, body, format="json")
    assert response.status_code == status, response.content
    assert "detail" in response.json()


@pytest.mark.django_db
def test_predict_auth(workspace, other_workspace, members, client_for):
    scene, _, _ = deployed(workspace, members[Role.MAINTAINER], versions=1)
    url = f"/api/v1/workspaces/{workspace.slug}/predict/"
    body = predict_body(scene, request_id="a")
    assert client_for(None).post(url, body, format="json").status_code == 401
    assert client_for(members["outsider"]).post(url, body, format="json").status_code == 404
    narrowed = client_for(members[Role.VIEWER], workspaces=[other_workspace])
    assert narrowed.post(url, body, format="json").status_code == 404
    forged = client_for(None)
    assert forged.post(url, body, format="json", HTTP_X_USER="admin").status_code == 401
    big = client_for(members[Role.VIEWER]).post(
        url, "x" * (1024 * 1024 + 10), content_type="application/json"
    )
    assert big.status_code in (400, 413)


@pytest.mark.django_db
def test_scaling_policies_and_kubernetes_manifest(workspace, members):
    from serving.deployments import deployment_create, desired_replicas

    actor = members[Role.MAINTAINER]
    _, (v1,), dep = deployed(workspace, actor, versions=1)
    dep = deployment_scale(
        actor=actor,
        workspace=workspace,
        deployment=dep,
        scaling={
            "mode": "schedule",
            "windows": [{"start": "08:00", "end": "20:00", "replicas": 4}],
        },
    )
    from datetime import UTC, datetime

    assert desired_replicas(dep, now=datetime(2026, 1, 1, 9, tzinfo=UTC)) == 4
    assert desired_replicas(dep, now=datetime(2026, 1, 1, 22, tzinfo=UTC)) == 1
    dep = deployment_scale(
        actor=actor,
        workspace=workspace,
        deployment=dep,
        scaling={"mode": "load", "target_qps_per_replica": 100, "min": 1, "max": 5},
    )
    assert desired_replicas(dep, qps=350) == 4 and desired_replicas(dep, qps=10_000) == 5
    with pytest.raises(ValidationError):
        deployment_scale(actor=actor, workspace=workspace, deployment=dep, scaling={"mode": "warp"})
    k8s = deployment_create(
        actor=actor,
        workspace=workspace,
        name="on-k8s",
        version=v1,
        backend=Backend.KUBERNETES,
        replicas=3,
        device="gpu",
    )
    # Nothing was applied in the request: the controller takes it up after the commit.
    assert deployment_status(k8s)["phase"] == "Pending"
    manifest = render_manifest(k8s)
    assert "replicas: 3" in manifest and "nvidia.com/gpu" in manifest
    assert v1.artifact_path in manifest and "serving.model_server" in manifest


@pytest.mark.django_db(transaction=True)
@pytest.mark.one_backend  # processes and files: the database under them changes nothing
def test_local_backend_supervises_model_server_processes(workspace, members):
    from serving.controllers import SUPERVISOR, deployment_reconcile
    from serving.deployments import deployment_create
    from serving.models import Deployment, DeploymentStatus

    actor = members[Role.MAINTAINER]
    _, (v1,), _ = deployed(workspace, actor, versions=1)

    def reconciled_until_ready(dep) -> DeploymentStatus:
        """The controller, run as its task runs it, until the replicas answer ready."""
        wait_until(
            lambda: deployment_reconcile(deployment_id=dep.pk) in ("Ready", "unchanged"),
            timeout=30,
            what="the replicas to answer ready",
            interval=0.2,
        )
        return DeploymentStatus.objects.for_workspace(workspace).get(deployment=dep)

    try:
        dep = deployment_create(
            actor=actor, workspace=workspace, name="local", version=v1, backend=Backend.LOCAL
        )
        assert dep.pk not in SUPERVISOR.procs  # the request started nothing
        status = reconciled_until_ready(dep)
        procs = status.detail["processes"]
        assert len(procs) == 1 and status.ready_replicas == 1
        # The replica answers its readiness probe: that is what Ready means here.
        fresh = Deployment.objects.for_workspace(workspace).get(pk=dep.pk)
        assert deployment_status(fresh)["phase"] == "Ready"
        # The replica loads a user artifact without the platform's credentials, as its own uid.
        pid = procs[0]["pid"]
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        names = {item.split(b"=", 1)[0].decode() for item in environ if item}
        assert not names & {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "MLFLOW_TRACKING_URI"}
        assert "PATH" in names and "PYTHONPATH" in names
        if sandbox.uid_switch_possible()[0]:
            proc_status = Path(f"/proc/{pid}/status").read_text()
            uid = next(
                line.split()[1] for line in proc_status.splitlines() if line.startswith("Uid:")
            )
            assert int(uid) == sandbox.server_uid(v1.pk) != os.geteuid()
        # Reconciling a converged deployment again does nothing new.
        assert deployment_reconcile(deployment_id=dep.pk) == "unchanged"
        assert [p["pid"] for p in SUPERVISOR.reconcile(dep)] == [pid]
        # A dead replica is restarted by the next reconcile (the resync's).
        SUPERVISOR.procs[dep.pk][0]["proc"].kill()
        SUPERVISOR.procs[dep.pk][0]["proc"].wait()
        again = reconciled_until_ready(dep).detail["processes"]
        assert len(again) == 1 and again[0]["pid"] != pid
        # Scaling is a desired-state change the controller follows.
        dep = deployment_scale(actor=actor, workspace=workspace, deployment=dep, replicas=2)
        fresh = Deployment.objects.for_workspace(workspace).get(pk=dep.pk)
        assert deployment_status(fresh)["phase"] == "Pending"
        assert len(reconciled_until_ready(dep).detail["processes"]) == 2
    finally:
        SUPERVISOR.stop_all()


_ = (routing, TABLES)


@pytest.mark.django_db
def test_the_gateway_wsgi_entry_answers_hot_routes_like_django(workspace, members):
    import io
    import json

    from django.core import signals
    from django.db import close_old_connections

    from serving import wsgi
    from workspaces.testing.factories import token_for

    scene, _, _ = deployed(workspace, members[Role.MAINTAINER], versions=1)
    key = token_for(members[Role.VIEWER])

    def call(path, body, auth=f"Token {key}"):
        data = json.dumps(body).encode()
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": path,
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(data)),
            "wsgi.input": io.BytesIO(data),
            "SERVER_NAME": "testserver",
            "SERVER_PORT": "80",
            "wsgi.url_scheme": "http",
            "HTTP_HOST": "testserver",
            "HTTP_AUTHORIZATION": auth,
        }
        seen = {}
        # As Django's test client does: keep the test's connection open across the signals.
        signals.request_started.disconnect(close_old_connections)
        signals.request_finished.disconnect(close_old_connections)
        try:
            chunks = wsgi.application(environ, lambda status, headers: seen.update(status=status))
        finally:
            signals.request_started.connect(close_old_connections)
            signals.request_finished.connect(close_old_connections)
        return seen["status"], json.loads(b"".join(chunks))

    assert wsgi._route({"REQUEST_METHOD": "GET", "PATH_INFO": "/healthz"}) is None
    url = f"/api/v1/workspaces/{workspace.slug}/predict/"
    status, body = call(url, predict_body(scene, request_id="w-1"))
    assert status == "200 OK" and len(body["scores"]) == 20
    status, body = call(url, predict_body(scene, request_id="w-2"), auth="Token wrong")
    assert status.startswith("401") and body["code"] == "authentication_failed"
    status, body = call(url, {"deployment": "main"})
    assert status.startswith("400")
