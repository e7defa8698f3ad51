"""The one action (``POST .../loops/``): a feature group to a running A/B experiment, stage by
stage through the real pipeline machinery (the training job's result is written in place of a
worker run here; the browser journey trains for real), and the quality gate refusing a worse
candidate in the API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError

from experiments import loop
from experiments.models import Experiment, ExperimentState
from features import registry as feature_registry
from features.models import EntityKind
from features.tests.factories import make_group
from lineage.models import AuditCategory, AuditItem
from lineage.projection import project
from serving.deployments import deployment_create
from serving.models import Deployment, ModelVersion
from serving.tests.factories import T0, ingest_rows, make_bundle, make_scene, make_spec
from serving.tests.helpers import passing_version
from training import pipelines
from training.models import JobState, PipelineRun, RunState, TrainingJob
from workspaces.exceptions import ConflictError
from workspaces.models import Event, Role
from workspaces.testing.factories import make_member

pytestmark = pytest.mark.django_db


def _extra_group(scene):
    group = make_group(
        scene.workspace,
        name=f"recent_{scene.users.name}",
        features=[{"name": "clicks_1d", "dtype": "int"}],
    )
    ingest_rows(
        None,
        group,
        [
            {"user_id": u, "event_time": T0.isoformat(), "clicks_1d": i % 3}
            for i, u in enumerate(scene.user_ids)
        ],
    )
    return group


def _advance(run) -> str:
    return pipelines.pipeline_run_advance(run.pk, dispatch=False)


def _finish_job(run, scene) -> TrainingJob:
    """What the node agent does when the loop's job trains: a bundle and held-out metrics."""
    job = TrainingJob.objects.for_workspace(scene.workspace).get(
        pk=run.stage_runs.get(name="train").output["job_id"]
    )
    bundle = make_bundle(make_spec(scene), seed=7)
    job.state = JobState.SUCCEEDED
    job.model_path = str(bundle.relative_to(Path(settings.ARTIFACT_ROOT)))
    job.metrics = {"holdout": {"auc": 0.7, "logloss": 0.6, "rows": 12}}
    job.save()
    return job


@pytest.fixture
def production(workspace, members):
    scene = make_scene(workspace, members[Role.MAINTAINER])
    version = passing_version(scene, None, name="ranker")
    dep = deployment_create(actor=None, workspace=workspace, name="main", version=version)
    return scene, dep


def test_the_loop_runs_from_a_feature_group_to_a_running_experiment(workspace, members, production):
    scene, dep = production
    group = _extra_group(scene)
    run = loop.loop_start(
        actor=members[Role.DEVELOPER], workspace=workspace, group=group.name, dispatch=False
    )
    assert run.params["deployment"] == "main"
    assert run.params["features"] == [f"{group.name}:clicks_1d"]
    assert _advance(run) == RunState.RUNNING  # waits for its training job
    stages = {s.name: s for s in run.stage_runs.all()}
    assert stages["add_feature"].state == stages["build_samples"].state == RunState.SUCCEEDED
    assert stages["train"].state == RunState.RUNNING
    workspace.refresh_from_db()
    stream = workspace.template["sample_stream"]
    assert stream["label_source"] == scene.labels.name
    assert f"{group.name}:clicks_1d" in stream["features"]
    job = TrainingJob.objects.for_workspace(workspace).get(pk=stages["train"].output["job_id"])
    assert job.compare_deployment == "main"
    assert f"{group.name}:clicks_1d" in job.dataset.feature_refs

    _finish_job(run, scene)
    assert _advance(run) == RunState.SUCCEEDED, PipelineRun.objects.unscoped().get(pk=run.pk).error
    run.refresh_from_db()
    exp = Experiment.objects.for_workspace(workspace).get(pk=run.context["experiment_id"])
    assert exp.state == ExperimentState.RUNNING
    assert exp.deployment_id == dep.pk and exp.traffic_percent == 5
    challenger = ModelVersion.objects.for_workspace(workspace).get(pk=exp.arms[1]["version_id"])
    assert challenger.model_id == dep.model_id and challenger.job_id == job.pk
    assert challenger.gate_status == "passed"
    assert challenger.quality["status"] == "not_evaluated"  # 12 held-out rows tell nothing
    assert exp.guardrails and exp.primary_metric == "ctr"

    summary = loop.loop_summary(PipelineRun.objects.unscoped().get(pk=run.pk))
    links = {s["name"]: s["object"] for s in summary["stages"]}
    assert links["train"]["url"] == f"/w/{workspace.slug}/training/jobs/{job.pk}/"
    assert links["experiment"]["url"] == f"/w/{workspace.slug}/experiments/{exp.key}/"
    assert links["register"]["label"] == str(challenger)
    assert all(s["state"] == "succeeded" for s in summary["stages"])


def test_a_worse_candidate_fails_the_loop_at_the_quality_gate_and_an_override_passes(
    workspace, members, production
):
    scene, dep = production
    group = _extra_group(scene)
    run = loop.loop_start(actor=None, workspace=workspace, group=group.name, dispatch=False)
    _advance(run)
    job = _finish_job(run, scene)
    bundle = str(Path(settings.ARTIFACT_ROOT) / dep.version.artifact_path)
    # the agent's comparison on the same 5000 held-out rows: production is clearly better
    job.metrics = {
        "holdout": {"auc": 0.700, "logloss": 0.62, "rows": 5000},
        "production": {"auc": 0.727, "logloss": 0.60, "rows": 5000, "bundle": bundle},
    }
    job.save()
    assert _advance(run) == RunState.FAILED
    run.refresh_from_db()
    gate = run.stage_runs.get(name="quality_gate")
    assert gate.state == RunState.FAILED
    assert "AUC 0.7000 is lower than production's 0.7270" in gate.error
    assert "logloss 0.6200 is higher than production's 0.6000" in gate.error
    summary = loop.loop_summary(run)
    assert summary["failed_stage"] == "quality_gate" and summary["quality_gate_failed"]

    loop.loop_retry(
        actor=members[Role.MAINTAINER],
        run=run,
        quality_override="the offline drop is within noise for this scene",
        dispatch=False,
    )
    assert _advance(run) == RunState.SUCCEEDED, PipelineRun.objects.unscoped().get(pk=run.pk).error
    run.refresh_from_db()
    assert run.context["quality"]["override"]["reason"].startswith("the offline drop")
    version = ModelVersion.objects.for_workspace(workspace).get(pk=run.context["model_version_id"])
    assert version.quality["status"] == "failed" and version.quality["override"]
    assert (
        Event.objects.for_workspace(workspace)
        .filter(verb="serving.candidate.quality_overridden")
        .exists()
    )
    project()
    item = AuditItem.objects.for_workspace(workspace).get(category=AuditCategory.QUALITY_OVERRIDE)
    assert "auc 0.7000 vs production 0.7270" in item.reason


def _worse_version(scene, dep):
    """A gated version whose job scored 0.027 AUC below production on the same rows."""
    version = passing_version(scene, None, name=dep.model.name, seed=3)
    bundle = str(Path(settings.ARTIFACT_ROOT) / dep.version.artifact_path)
    TrainingJob.objects.for_workspace(scene.workspace).filter(pk=version.job_id).update(
        metrics={
            "holdout": {"auc": 0.700, "logloss": 0.60, "rows": 5000},
            "production": {"auc": 0.727, "logloss": 0.60, "rows": 5000, "bundle": bundle},
        }
    )
    return ModelVersion.objects.for_workspace(scene.workspace).get(pk=version.pk)


def test_the_api_refuses_to_release_a_worse_candidate_until_a_maintainer_overrides(
    workspace, members, production, client_for
):
    scene, dep = production
    worse = _worse_version(scene, dep)
    base = f"/api/v1/workspaces/{workspace.slug}"
    maintainer = client_for(members[Role.MAINTAINER])
    answer = maintainer.post(
        f"{base}/deployments/main/release/", {"version_id": worse.pk}, format="json"
    )
    assert answer.status_code == 409, answer.content
    body = answer.json()
    assert body["attr"] == "quality" and body["metric"] == "auc"
    assert body["candidate"] == pytest.approx(0.700) and body["production"] == pytest.approx(0.727)
    assert "0.7000" in body["detail"] and "0.7270" in body["detail"]
    live = Deployment.objects.for_workspace(workspace).get(pk=dep.pk)
    assert live.version_id == dep.version_id  # nothing moved

    developer = client_for(members[Role.DEVELOPER])
    override = f"{base}/model-versions/{worse.pk}/quality-override/"
    assert developer.post(override, {"reason": "x"}, format="json").status_code == 403
    empty = maintainer.post(override, {"reason": ""}, format="json")
    assert empty.status_code == 400 and empty.json()["attr"] == "reason"
    done = maintainer.post(override, {"reason": "ship it for the holiday test"}, format="json")
    assert done.status_code == 200, done.content
    assert done.json()["quality"]["override"]["reason"] == "ship it for the holiday test"
    again = maintainer.post(
        f"{base}/deployments/main/release/", {"version_id": worse.pk}, format="json"
    )
    assert again.status_code == 202, again.content
    assert Deployment.objects.for_workspace(workspace).get(pk=dep.pk).version_id == worse.pk


def test_an_experiment_with_a_worse_treatment_is_refused_at_submit(
    workspace, members, production, client_for
):
    scene, dep = production
    worse = _worse_version(scene, dep)
    base = f"/api/v1/workspaces/{workspace.slug}"
    developer = client_for(members[Role.DEVELOPER])
    created = developer.post(
        f"{base}/experiments/",
        {
            "key": "worse",
            "hypothesis": "h",
            "deployment": "main",
            "treatment_versions": [worse.pk],
            "guardrails": [{"metric": "ctr", "max_drop": 0.1}],
            "ramp_plan": [5],
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    submit = developer.post(f"{base}/experiments/worse/submit/")
    assert submit.status_code == 409 and submit.json()["metric"] == "auc"
    assert Experiment.objects.for_workspace(workspace).get(key="worse").state == "draft"


def test_loop_api_validates_and_isolates(
    workspace, other_workspace, members, production, client_for
):
    scene, _ = production
    group = _extra_group(scene)
    base = f"/api/v1/workspaces/{workspace.slug}/loops/"
    developer = client_for(members[Role.DEVELOPER])
    unknown = developer.post(base, {"group": "nope"}, format="json")
    assert unknown.status_code == 404 and unknown.json()["attr"] == "group"
    bad = developer.post(base, {"group": group.name, "features": ["zzz"]}, format="json")
    assert bad.status_code == 400 and bad.json()["attr"] == "features"
    assert "clicks_1d" in bad.json()["detail"]
    no_dep = developer.post(base, {"group": group.name, "deployment": "zz"}, format="json")
    assert no_dep.status_code == 404 and no_dep.json()["attr"] == "deployment"
    viewer = client_for(members[Role.VIEWER])
    assert viewer.post(base, {"group": group.name}, format="json").status_code == 403
    started = developer.post(base, {"group": group.name}, format="json")
    assert started.status_code == 202, started.content
    body = started.json()
    assert [s["name"] for s in body["stages"]] == [s["name"] for s in loop.LOOP_STAGES]
    assert started["Location"].endswith(f"/loops/{body['id']}/")
    twice = developer.post(base, {"group": group.name}, format="json")
    assert twice.status_code == 409 and twice.json()["attr"] == "group"
    assert developer.get(f"{base}{body['id']}/").json()["group"] == group.name
    # another workspace's loop answers 404, its groups are not found
    outsider = client_for(make_member(other_workspace, Role.DEVELOPER))
    other = f"/api/v1/workspaces/{other_workspace.slug}/loops/"
    assert outsider.get(f"{other}{body['id']}/").status_code == 404
    assert outsider.post(other, {"group": group.name}, format="json").status_code == 404
    assert json.loads(developer.get(base).content)["results"][0]["id"] == body["id"]


def test_a_finished_candidate_evaluation_becomes_a_group_and_its_loop_builds_with_it(
    workspace, members, production
):
    from training import candidates

    scene, _ = production
    rows = "user_id,value\n" + "".join(f"{u},{i % 5}\n" for i, u in enumerate(scene.user_ids))
    evaluation = candidates.candidate_evaluation_create(
        actor=None,
        workspace=workspace,
        name="recency",
        dataset=scene.dataset,
        key_column="user_id",
        content=rows.encode(),
        dispatch=False,
    )
    with pytest.raises(ConflictError):  # not finished yet
        loop.loop_start(actor=None, workspace=workspace, evaluation=evaluation.pk, dispatch=False)
    type(evaluation).objects.for_workspace(workspace).filter(pk=evaluation.pk).update(
        state=RunState.SUCCEEDED
    )
    run = loop.loop_start(actor=None, workspace=workspace, evaluation=evaluation.pk, dispatch=False)
    assert run.params["group"] == "cand_recency"
    assert run.params["features"] == ["cand_recency:value"]
    _advance(run)
    dataset_id = run.stage_runs.get(name="build_samples").output["dataset_id"]
    from features.models import Dataset

    dataset = Dataset.objects.for_workspace(workspace).get(pk=dataset_id)
    assert "cand_recency:value" in dataset.feature_refs and dataset.status == "ready"


def test_the_pages_start_a_loop_show_its_stages_and_offer_the_override_to_maintainers(
    workspace, members, production, client
):
    scene, dep = production
    group = _extra_group(scene)
    client.force_login(members[Role.DEVELOPER])
    page = client.get(f"/w/{workspace.slug}/features/groups/{group.name}/")
    assert b'data-testid="try-in-experiment"' in page.content
    label_page = client.get(f"/w/{workspace.slug}/features/groups/{scene.labels.name}/")
    assert b'data-testid="try-in-experiment"' not in label_page.content
    empty = client.get(f"/w/{workspace.slug}/loops/")
    assert b"No loops yet" in empty.content
    bad = client.post(f"/w/{workspace.slug}/loops/new/", {"group": "nope"})
    assert bad.status_code == 400
    assert b"no feature group" in bad.content and group.name.encode() in bad.content
    # (the on-commit wake-up never fires inside the test's transaction: the test advances)
    started = client.post(f"/w/{workspace.slug}/loops/new/", {"group": group.name})
    assert started.status_code == 302
    run = loop.loops_of(workspace).get()
    assert started["Location"] == f"/w/{workspace.slug}/loops/{run.pk}/"
    _advance(run)
    job = _finish_job(run, scene)
    bundle = str(Path(settings.ARTIFACT_ROOT) / dep.version.artifact_path)
    job.metrics = {
        "holdout": {"auc": 0.70, "logloss": 0.6, "rows": 900},
        "production": {"auc": 0.727, "logloss": 0.6, "rows": 900, "bundle": bundle},
    }
    job.save()
    assert _advance(run) == RunState.FAILED
    detail = client.get(f"/w/{workspace.slug}/loops/{run.pk}/").content.decode()
    assert 'data-stage="quality_gate" data-state="failed"' in detail
    assert "0.7000 is lower than production" in detail
    assert "Retry from quality_gate" in detail
    assert 'data-testid="quality-override"' not in detail  # a developer may not override
    live = client.get(f"/w/{workspace.slug}/loops/{run.pk}/", HTTP_HX_REQUEST="true")
    assert live.content.decode().lstrip().startswith('<div id="loop-stages"')
    refused = client.post(
        f"/w/{workspace.slug}/loops/{run.pk}/retry/", {"quality_override": "because"}
    )
    assert refused.status_code == 403

    client.force_login(members[Role.MAINTAINER])
    detail = client.get(f"/w/{workspace.slug}/loops/{run.pk}/").content.decode()
    assert 'data-testid="quality-override"' in detail
    client.post(f"/w/{workspace.slug}/loops/{run.pk}/retry/", {"quality_override": "noise"})
    run.refresh_from_db()
    assert run.state == RunState.RUNNING and run.params["quality_override"] == "noise"
    assert _advance(run) == RunState.SUCCEEDED
    done = client.get(f"/w/{workspace.slug}/loops/{run.pk}/").content.decode()
    assert 'data-testid="loop-done"' in done and "running" in done


def test_the_version_page_shows_the_refusal_and_a_maintainer_overrides_there(
    workspace, members, production, client
):
    scene, dep = production
    worse = _worse_version(scene, dep)
    page = f"/w/{workspace.slug}/models/{dep.model.name}/v{worse.version}/"
    client.force_login(members[Role.MAINTAINER])
    refused = client.post(f"{page}deploy/", {"deployment": "main", "reason": "try"})
    text = refused.content.decode()
    assert "fails the quality gate" in text and "0.7000" in text and "0.7270" in text
    shown = client.get(page).content.decode()
    assert 'data-testid="quality-gate" data-status="failed"' in shown
    assert 'data-testid="quality-override-form"' in shown
    client.post(f"{page}quality-override/", {"reason": "accepted for the holiday test"})
    shown = client.get(page).content.decode()
    assert 'data-testid="quality-override-done"' in shown and "holiday test" in shown
    released = client.post(f"{page}deploy/", {"deployment": "main", "reason": "go"})
    assert released.status_code == 302, released.content.decode()[:2000]
    assert Deployment.objects.for_workspace(workspace).get(pk=dep.pk).version_id == worse.pk
    client.force_login(members[Role.DEVELOPER])
    assert client.post(f"{page}quality-override/", {"reason": "x"}).status_code == 403


def test_a_group_that_cannot_join_the_stream_is_refused_before_anything_runs(
    workspace, members, production
):
    scene, _ = production
    items_only = feature_registry.feature_group_register(
        actor=None,
        workspace=workspace,
        name="by_context",
        entity=EntityKind.CONTEXT,
        entity_keys=["context_id"],
        features=[{"name": "hour", "dtype": "int"}],
    )
    with pytest.raises(ValidationError) as refused:
        loop.loop_start(actor=None, workspace=workspace, group=items_only.name, dispatch=False)
    assert "joins on context_id" in str(refused.value.message_dict["group"])
    with pytest.raises(ValidationError):
        loop.loop_start(actor=None, workspace=workspace, group=scene.labels.name, dispatch=False)
    assert not loop.loops_of(workspace).exists()


def test_a_drop_within_the_policy_passes_and_the_policy_is_the_workspaces(
    workspace, members, production
):
    from serving.quality import job_verdict
    from workspaces.services import workspace_update

    scene, dep = production
    worse = _worse_version(scene, dep)  # 0.027 below production
    job = TrainingJob.objects.for_workspace(workspace).get(pk=worse.job_id)
    job.metrics = {**job.metrics, "holdout": {"auc": 0.722, "logloss": 0.60, "rows": 5000}}
    assert job_verdict(job, dep)["status"] == "passed"  # 0.005: within the default 0.01
    workspace_update(
        actor=None,
        workspace=workspace,
        template={**workspace.template, "quality_gate": {"max_auc_drop": 0.001}},
    )
    dep.workspace.refresh_from_db()
    verdict = job_verdict(job, dep)
    assert verdict["status"] == "failed" and verdict["failures"][0]["limit"] == 0.001
