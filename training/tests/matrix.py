"""Permission-matrix rows for the training app's API routes."""

from __future__ import annotations

import itertools

from training import pipelines, services
from training.tests.factories import make_demo_dataset
from workspaces.models import Role
from workspaces.testing.permission_matrix import Endpoint, MatrixContext

WS = "/api/v1/workspaces/{ws}"
_names = itertools.count(1)


def _dataset(ctx: MatrixContext):
    if "dataset" not in ctx.extra:
        ctx.extra["dataset"] = make_demo_dataset(ctx.workspace, scale=0.01)
    return ctx.extra["dataset"]


def _job(ctx: MatrixContext) -> dict:
    job = services.job_create(
        actor=None,
        workspace=ctx.workspace,
        name=f"matrix-job-{next(_names)}",
        dataset=_dataset(ctx),
        template="logreg",
    )
    return {"pk": job.pk}


def _job_body(ctx: MatrixContext) -> dict:
    return {"name": f"new-job-{next(_names)}", "template": "logreg", "dataset": _dataset(ctx).pk}


def _entry_point(ctx: MatrixContext) -> dict:
    entry = services.entry_point_register(
        actor=None,
        workspace=ctx.workspace,
        name=f"matrix-entry-{next(_names)}",
        module="training.templates.logreg",
    )
    return {"name": entry.name}


def _pipeline(ctx: MatrixContext) -> dict:
    pipeline = pipelines.pipeline_create(
        actor=None, workspace=ctx.workspace, name=f"matrix-pipeline-{next(_names)}"
    )
    return {"name": pipeline.name}


def _pipeline_run(ctx: MatrixContext) -> dict:
    from training.models import Pipeline

    name = _pipeline(ctx)["name"]
    pipeline = Pipeline.objects.for_workspace(ctx.workspace).get(name=name)
    run = pipelines.pipeline_run_start(actor=None, pipeline=pipeline, dispatch=False)
    return {"pk": run.pk}


def _failed_run(ctx: MatrixContext) -> dict:
    kwargs = _pipeline_run(ctx)
    pipelines.pipeline_run_advance(kwargs["pk"], dispatch=False)  # no dataset param: fails
    return kwargs


def _candidate_body(ctx: MatrixContext) -> dict:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return {
        "name": f"cand-{next(_names)}",
        "dataset": _dataset(ctx).pk,
        "key_column": "user_id",
        "file": SimpleUploadedFile("v.csv", b"user_id,value\nu0001,1.5\n"),
    }


def _candidate(ctx: MatrixContext) -> dict:
    from training import candidates

    evaluation = candidates.candidate_evaluation_create(
        actor=None,
        workspace=ctx.workspace,
        name=f"cand-{next(_names)}",
        dataset=_dataset(ctx),
        key_column="user_id",
        content=b"user_id,value\nu0001,1.5\n",
        dispatch=False,
    )
    return {"pk": evaluation.pk}


def _tuning_body(ctx: MatrixContext) -> dict:
    return {
        "name": f"new-tune-{next(_names)}",
        "template": "logreg",
        "dataset": _dataset(ctx).pk,
        "n_trials": 2,
    }


def _tuning_job(ctx: MatrixContext) -> dict:
    from training import tuning

    tj = tuning.tuning_job_create(
        actor=None,
        workspace=ctx.workspace,
        name=f"matrix-tune-{next(_names)}",
        dataset=_dataset(ctx),
        template="logreg",
        n_trials=2,
        dispatch=False,
    )
    return {"pk": tj.pk}


def _notebook(ctx: MatrixContext, *, pid: int | None) -> dict:
    """A starting server of the caller's (no process is started: a live pid that answers
    nothing keeps it starting, and ``None`` lets stop() end it without signalling anything)."""
    from django.utils import timezone

    from training.models import NotebookServer

    user = ctx.actor or ctx.new_user()
    # One live server per member and workspace: an earlier call's row is ended first.
    NotebookServer.objects.for_workspace(ctx.workspace).filter(
        user=user, state__in=["starting", "running"]
    ).update(state="stopped")
    server = NotebookServer.objects.create(
        workspace=ctx.workspace,
        user=user,
        secret="matrix",
        port=1,
        pid=pid,
        idle_timeout_s=60,
        started_at=timezone.now(),
    )
    return {"pk": server.pk}


def _live_notebook(ctx: MatrixContext) -> dict:
    import os

    return _notebook(ctx, pid=os.getpid())


def _stoppable_notebook(ctx: MatrixContext) -> dict:
    return _notebook(ctx, pid=None)


ENDPOINTS = [
    Endpoint("GET", WS + "/tuning-jobs/", role=Role.VIEWER),
    Endpoint("POST", WS + "/tuning-jobs/", role=Role.DEVELOPER, success=201, body=_tuning_body),
    Endpoint("GET", WS + "/tuning-jobs/{pk}/", setup=_tuning_job, has_object=True),
    Endpoint(
        "POST",
        WS + "/tuning-jobs/{pk}/cancel/",
        role=Role.DEVELOPER,
        setup=_tuning_job,
        has_object=True,
    ),
    Endpoint("GET", WS + "/candidate-evaluations/", role=Role.VIEWER),
    Endpoint(
        "POST",
        WS + "/candidate-evaluations/",
        role=Role.DEVELOPER,
        success=201,
        body=_candidate_body,
        format="multipart",
    ),
    Endpoint("GET", WS + "/candidate-evaluations/{pk}/", setup=_candidate, has_object=True),
    Endpoint("GET", WS + "/training-jobs/", role=Role.VIEWER),
    Endpoint("POST", WS + "/training-jobs/", role=Role.DEVELOPER, success=201, body=_job_body),
    Endpoint("GET", WS + "/training-jobs/{pk}/", setup=_job, has_object=True),
    Endpoint("GET", WS + "/training-jobs/{pk}/metrics/", setup=_job, has_object=True),
    Endpoint("GET", WS + "/training-jobs/{pk}/log/", setup=_job, has_object=True),
    Endpoint(
        "POST",
        WS + "/training-jobs/{pk}/cancel/",
        role=Role.DEVELOPER,
        setup=_job,
        has_object=True,
    ),
    Endpoint("GET", WS + "/training-templates/", role=Role.VIEWER),
    Endpoint(
        "GET",
        WS + "/training-templates/{name}/",
        role=Role.VIEWER,
        setup=lambda ctx: {"name": "logreg"},
    ),
    Endpoint("GET", WS + "/entry-points/", role=Role.VIEWER),
    Endpoint(
        "POST",
        WS + "/entry-points/",
        role=Role.DEVELOPER,
        success=201,
        body=lambda ctx: {
            "name": f"new-entry-{next(_names)}",
            "script": "from training.templates.logreg import build\n",
        },
    ),
    Endpoint("GET", WS + "/entry-points/{name}/", setup=_entry_point, has_object=True),
    Endpoint("GET", WS + "/pipelines/", role=Role.VIEWER),
    Endpoint(
        "POST",
        WS + "/pipelines/",
        role=Role.DEVELOPER,
        success=201,
        body=lambda ctx: {"name": f"new-pipeline-{next(_names)}"},
    ),
    Endpoint("GET", WS + "/pipelines/{name}/", setup=_pipeline, has_object=True),
    Endpoint(
        "POST",
        WS + "/pipelines/{name}/run/",
        role=Role.DEVELOPER,
        success=201,
        setup=_pipeline,
        has_object=True,
        body=lambda ctx: {"params": {}},
    ),
    Endpoint("GET", WS + "/pipeline-runs/", role=Role.VIEWER),
    Endpoint("GET", WS + "/pipeline-runs/{pk}/", setup=_pipeline_run, has_object=True),
    Endpoint(
        "POST",
        WS + "/pipeline-runs/{pk}/retry/",
        role=Role.DEVELOPER,
        setup=_failed_run,
        has_object=True,
    ),
    Endpoint("GET", WS + "/notebooks/", role=Role.VIEWER),
    # The caller's live server is answered (200), so no Jupyter process starts per principal;
    # starting one for real is training/tests/test_notebooks.py's.
    Endpoint("POST", WS + "/notebooks/", role=Role.VIEWER, setup=_live_notebook),
    Endpoint("GET", WS + "/notebooks/{pk}/", setup=_stoppable_notebook, has_object=True),
    Endpoint(
        "POST",
        WS + "/notebooks/{pk}/stop/",
        role=Role.VIEWER,
        setup=_stoppable_notebook,
        has_object=True,
    ),
]
