"""Serving's "register" and "deploy" stages run inside a real training pipeline."""

import pytest

from serving.models import Deployment, ModelVersion
from serving.tests.factories import make_bundle, make_job, make_scene, make_spec
from training import evaluation, pipelines
from training.models import PipelineRun, RunState
from workspaces.models import Role


@pytest.mark.django_db
def test_register_then_deploy_stages_release_a_gated_version(workspace, members):
    assert pipelines.stage_handler("register").__module__ == "serving.pipeline"
    actor = members[Role.MAINTAINER]
    scene = make_scene(workspace, actor, labels=20)
    job = make_job(scene, make_bundle(make_spec(scene)))
    pipeline = pipelines.pipeline_create(
        actor=None,
        workspace=workspace,
        name="ctr",
        stages=[
            {"name": "register", "kind": "register", "params": {"model": "ctr-model"}},
            {
                "name": "deploy",
                "kind": "deploy",
                "after": ["register"],
                "params": {"deployment": "ctr-live"},
            },
        ],
    )
    run = pipelines.pipeline_run_start(actor=None, pipeline=pipeline, params={}, dispatch=False)
    PipelineRun.objects.for_workspace(workspace).filter(pk=run.pk).update(
        context={"job_id": job.pk}
    )
    assert pipelines.pipeline_run_advance(run.pk, dispatch=False) == RunState.SUCCEEDED
    version = ModelVersion.objects.for_workspace(workspace).get(model__name="ctr-model")
    assert version.job == job and version.gate_status == "passed"
    assert Deployment.objects.for_workspace(workspace).get(name="ctr-live").version == version
    # Training's evaluation finds the production model through serving's resolver.
    assert evaluation.production_bundle_path(workspace).endswith(version.artifact_path)
