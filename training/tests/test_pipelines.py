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
