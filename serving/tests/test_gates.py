"""Acceptance: a planted serving/training skew fails the consistency gate and cannot deploy; a
good version passes both gates and is released automatically; the sandbox runs a real process."""

import pytest

from serving import registry
from serving.deployments import deployment_create
from serving.gates import version_gates_run
from serving.models import Deployment, GateStatus
from serving.pipeline import gates_and_deploy
from serving.tests.factories import make_bundle, make_job, make_scene, make_spec
from workspaces.models import Event, Role


@pytest.mark.django_db
def test_planted_skew_fails_consistency_and_a_good_version_auto_deploys(
    workspace, members, client_for
):
    actor = members[Role.MAINTAINER]
    scene = make_scene(workspace, actor)
    u = scene.users.name
    # The planted version: its serving path scales the user's ctr by 1.01 (training does not).
    bad_job = make_job(
        scene, make_bundle(make_spec(scene, serving_transforms={f"{u}:ctr": {"scale": 1.01}}))
    )
    bad = registry.model_version_register(actor=actor, workspace=workspace, name="rk", job=bad_job)
    bad = gates_and_deploy(actor=actor, workspace=workspace, version=bad, deployment="main")
    assert bad.gate_status == GateStatus.FAILED
    consistency = bad.gates["consistency"]
    assert consistency["status"] == GateStatus.FAILED
    assert consistency["max_score_diff"] > 1e-6
    assert f"{u}:ctr" in consistency["differing_features"]
    assert not Deployment.objects.for_workspace(workspace).exists()
    assert Event.objects.filter(
        workspace=workspace, verb="serving.model_version.gates_failed"
    ).exists()

    client = client_for(actor)
    url = f"/api/v1/workspaces/{workspace.slug}/deployments/"
    response = client.post(url, {"name": "main", "version_id": bad.pk}, format="json")
    assert response.status_code == 409
    assert "consistency gate" in response.json()["detail"]
    assert response.json()["attr"] == "consistency"

    good_job = make_job(scene, make_bundle(make_spec(scene), seed=3))
    good = registry.model_version_register(
        actor=actor, workspace=workspace, name="rk", job=good_job
    )
    good = gates_and_deploy(actor=actor, workspace=workspace, version=good, deployment="main")
    assert good.gate_status == GateStatus.PASSED, good.gates
    assert good.gates["consistency"]["max_score_diff"] <= 1e-6
    assert good.gates["consistency"]["entities"] > 10
    assert good.gates["performance"]["p99_ms"] > 0
    dep = Deployment.objects.for_workspace(workspace).get(name="main")
    assert dep.version == good
    good.model.refresh_from_db()
    assert good.model.aliases["production"] == good.version

    # The version page shows the gates.
    client.force_login(actor)
    page = client.get(f"/w/{workspace.slug}/models/rk/v{bad.version}/")
    assert page.status_code == 200
    assert b"consistency" in page.content and b"failed" in page.content


@pytest.mark.django_db
def test_sandbox_runs_one_model_server_process_and_checks_limits(workspace, members, settings):
    actor = members[Role.MAINTAINER]
    scene = make_scene(workspace, actor, labels=20)
    job = make_job(scene, make_bundle(make_spec(scene)))
    version = registry.model_version_register(actor=actor, workspace=workspace, name="rk", job=job)
    settings.SERVING_SANDBOX = "process"
    version = version_gates_run(actor=actor, workspace=workspace, version=version)
    perf = version.gates["performance"]
    assert perf["mode"] == "process" and perf["status"] == GateStatus.PASSED, perf
    assert perf["candidates"] == 100 and perf["requests"] >= 20 and perf["rps"] > 0
    # The same model against a workspace limit it cannot meet fails, naming the limit.
    settings.SERVING_SANDBOX = "inprocess"
    settings.SERVING_LIMITS = {"p50_ms": 0.000001}
    version = version_gates_run(actor=actor, workspace=workspace, version=version)
    assert version.gates["performance"]["status"] == GateStatus.FAILED
    assert "p50" in version.gates["performance"]["detail"]
    with pytest.raises(Exception, match="performance gate"):
        deployment_create(actor=actor, workspace=workspace, name="x", version=version)


@pytest.mark.django_db
def test_gates_rerun_through_the_api_is_queued_once_and_runs_on_a_worker(
    workspace, members, client_for
):
    from serving.tasks import run_gates

    actor = members[Role.MAINTAINER]
    scene = make_scene(workspace, actor, labels=20)
    version = registry.model_version_register(
        actor=actor,
        workspace=workspace,
        name="rk",
        job=make_job(scene, make_bundle(make_spec(scene))),
    )
    url = f"/api/v1/workspaces/{workspace.slug}/model-versions/{version.pk}/gates/"
    assert client_for(members[Role.DEVELOPER]).post(url).status_code == 403
    client = client_for(actor)
    queued = client.post(url)
    assert queued.status_code == 202, queued.content
    assert queued.json()["gates"]["run"]["state"] == "queued"
    again = client.post(url)
    assert again.status_code == 409 and again.json()["attr"] == "gates"
    assert "already queued" in again.json()["detail"]
    run_gates(version.pk, actor.pk)  # what the worker runs
    version.refresh_from_db()
    assert set(version.gates) == {"consistency", "performance"}
    assert version.gate_status == GateStatus.PASSED
    assert run_gates(version.pk, actor.pk) == "done"  # a redelivery measures nothing again
    assert client.post(url).status_code == 202
    verbs = list(
        Event.objects.filter(workspace=workspace, verb__startswith="serving.model_version.gates")
        .order_by("id")
        .values_list("verb", flat=True)
    )
    assert verbs[-3:] == [
        "serving.model_version.gates_requested",
        "serving.model_version.gates_passed",
        "serving.model_version.gates_requested",
    ]
