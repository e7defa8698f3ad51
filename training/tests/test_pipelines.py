"""Pipelines run stage after stage; a failed run retries from the failed stage; right-hand
apps register stage handlers."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from training import agent, pipelines
from training.models import JobState, RunState, TrainingJob
from training.tests.factories import FAST, make_demo_dataset, make_node, place

pytestmark = pytest.mark.django_db(transaction=True)


def test_stage_definitions_are_checked(workspace):
    with pytest.raises(ValidationError):
        pipelines.pipeline_create(
            actor=None, workspace=workspace, name="bad", stages=[{"name": "a", "kind": "nope"}]
        )
    with pytest.raises(ValidationError):
        pipelines.pipeline_create(
            actor=None,
            workspace=workspace,
            name="cycle",
            stages=[
                {"name": "a", "kind": "train", "after": ["b"]},
                {"name": "b", "kind": "train", "after": ["a"]},
            ],
        )
    pipeline = pipelines.pipeline_create(actor=None, workspace=workspace, name="default")
    assert [s["name"] for s in pipeline.stages] == [
        "build_samples",
        "train",
        "evaluate",
        "register",
    ]


def test_default_pipeline_runs_through_and_retries_from_the_failed_stage(workspace):
    dataset = make_demo_dataset(workspace, scale=0.05)
    calls = []

    def register(run, stage, context):
        calls.append(context["job_id"])
        if len(calls) == 1:
            raise RuntimeError("registry unavailable")
        return {"model_version": 7}

    previous = pipelines._HANDLERS["register"]
    pipelines.register_stage("register", register)
    try:
        pipeline = pipelines.pipeline_create(actor=None, workspace=workspace, name="ctr")
        run = pipelines.pipeline_run_start(
            actor=None,
            pipeline=pipeline,
            params={"dataset_id": dataset.pk, "train_params": FAST, "template": "logreg"},
            dispatch=False,
        )
        assert pipelines.pipeline_run_advance(run.pk, dispatch=False) == RunState.RUNNING
        job = TrainingJob.objects.for_workspace(workspace).get()
        assert job.priority_class == "production"
        place(job, make_node())
        assert agent.execute_job(job.pk) == JobState.SUCCEEDED
        assert pipelines.pipeline_run_advance(run.pk, dispatch=False) == RunState.FAILED
        run.refresh_from_db()
        states = {s.name: s.state for s in run.stage_runs.all()}
        assert states == {
            "build_samples": "succeeded",
            "train": "succeeded",
            "evaluate": "succeeded",
            "register": "failed",
        }
        pipelines.pipeline_run_retry(actor=None, run=run, dispatch=False)
        assert pipelines.pipeline_run_advance(run.pk, dispatch=False) == RunState.SUCCEEDED
        run.refresh_from_db()
        assert run.context["model_version"] == 7 and calls == [job.pk, job.pk]
        assert TrainingJob.objects.for_workspace(workspace).count() == 1  # train not rerun
    finally:
        pipelines.register_stage("register", previous)


def test_evaluate_gate_fails_the_run(workspace):
    dataset = make_demo_dataset(workspace, scale=0.05)
    pipeline = pipelines.pipeline_create(
        actor=None,
        workspace=workspace,
        name="gated",
        stages=[
            {"name": "build_samples", "kind": "build_samples"},
            {"name": "train", "kind": "train", "after": ["build_samples"]},
            {
                "name": "evaluate",
                "kind": "evaluate",
                "after": ["train"],
                "params": {"min_auc": 0.99},
            },
        ],
    )
    run = pipelines.pipeline_run_start(
        actor=None,
        pipeline=pipeline,
        params={"dataset_id": dataset.pk, "train_params": FAST, "template": "logreg"},
        dispatch=False,
    )
    pipelines.pipeline_run_advance(run.pk, dispatch=False)
    job = TrainingJob.objects.for_workspace(workspace).get()
    place(job, make_node())
    agent.execute_job(job.pk)
    assert pipelines.pipeline_run_advance(run.pk, dispatch=False) == RunState.FAILED
    run.refresh_from_db()
    assert "below the gate" in run.error


def test_one_advance_at_a_time_and_the_wake_up_carries_the_lease(workspace):
    """A second advance while the lease is held returns without running a stage; a waiting
    run's lease is parked for its wake-up (the sweep leaves it alone) and only that wake-up
    takes it early; a lapsed lease is re-queued by the sweep."""
    from datetime import timedelta
    from unittest.mock import patch

    from django.utils import timezone

    from training.models import PipelineRun

    calls: list[str] = []

    def waiting(run, stage, context):
        calls.append(stage.name)
        return pipelines.WAIT

    pipelines.register_stage("test_wait", waiting)
    try:
        pipeline = pipelines.pipeline_create(
            actor=None,
            workspace=workspace,
            name="lease",
            stages=[{"name": "hold", "kind": "test_wait"}],
        )
        run = pipelines.pipeline_run_start(actor=None, pipeline=pipeline, dispatch=False)
        runs = PipelineRun.objects.for_workspace(workspace)
        runs.filter(pk=run.pk).update(lease_until=timezone.now() + timedelta(seconds=60))
        assert pipelines.pipeline_run_advance(run.pk, dispatch=False) == RunState.RUNNING
        assert calls == []  # someone else holds it: nothing ran
        runs.filter(pk=run.pk).update(lease_until=None)
        sent: list[tuple] = []
        with patch.object(pipelines, "_dispatch", lambda *a: sent.append(a)):
            pipelines.pipeline_run_advance(run.pk)
            assert calls == ["hold"] and len(sent) == 1
            run_id, countdown, token = sent[0]
            assert run_id == run.pk and countdown == pipelines.WAIT_COUNTDOWN_S
            parked = runs.get(pk=run.pk).lease_until
            assert parked is not None and parked > timezone.now()
            assert pipelines.pipeline_runs_resume() == 0  # its wake-up is on the way
            pipelines.pipeline_run_advance(run.pk, dispatch=False)  # a stray delivery
            assert calls == ["hold"]
            pipelines.pipeline_run_advance(run.pk, dispatch=False, lease=token)  # the wake-up
            assert calls == ["hold", "hold"]
            assert runs.get(pk=run.pk).lease_until is None
            runs.filter(pk=run.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
            assert pipelines.pipeline_runs_resume() == 1  # a lost wake-up is sent again
    finally:
        pipelines._HANDLERS.pop("test_wait", None)


def test_the_held_out_comparison_uses_the_named_deployment_not_the_last_changed(workspace):
    from serving.deployments import deployment_create
    from serving.pipeline import production_model_resolver
    from serving.tests.helpers import deployed, passing_version

    scene, versions, _ = deployed(workspace, None, versions=1, name="main")
    other = passing_version(scene, None, name="other-model", seed=5)
    deployment_create(actor=None, workspace=workspace, name="side", version=other)  # newest
    assert str(production_model_resolver(workspace, "main")).endswith(versions[0].artifact_path)
    assert str(production_model_resolver(workspace, "side")).endswith(other.artifact_path)
    assert production_model_resolver(workspace, "") is None  # two deployments: say which
    assert production_model_resolver(workspace, "nope") is None
