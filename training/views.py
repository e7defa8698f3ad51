"""Browser UI of training: the job list with live progress, a job's page (curves, evaluation
plots, resources, placement and checkpoint history, log, MLflow run) and pipelines with their
DAG. The live parts poll small JSON views here (session auth, same workspace checks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from training import curves, mlflow_server, services, trainjobs
from training import pipelines as pipeline_services
from training.forms import (
    JobCreateForm,
    PipelineCreateForm,
    PipelineRunForm,
    put_service_errors,
)
from training.models import (
    CandidateEvaluation,
    JobMetric,
    JobState,
    Node,
    Pipeline,
    PipelineRun,
    TrainingJob,
)
from training.params import job_hyperparameters, param_text, small_validation_hint
from workspaces.exceptions import ConflictError
from workspaces.models import Event, Role
from workspaces.selectors import role_at_least
from workspaces.views import WorkspaceRequest, page_context, workspace_page

JOBS_SHOWN = 100
LOG_TAIL_BYTES = 8000
SERIES_POINTS = 400


def _job_row(job: TrainingJob) -> dict[str, Any]:
    return {
        "id": job.pk,
        "name": job.name,
        "template": job.template or job.entry_point,
        "state": job.state,
        "state_reason": job.state_reason,
        "step": job.step,
        "total_steps": job.total_steps,
        "progress": min(1.0, job.step / job.total_steps) if job.total_steps else 0.0,
        "epoch": job.epoch,
        "loss": job.loss,
        "samples_per_s": round(job.samples_per_s, 1),
        "eta_s": None if job.eta_s is None else round(job.eta_s, 1),
        "node": job.node.name if job.node_id else None,
        "auc": ((job.metrics or {}).get("holdout") or {}).get("auc"),
        "checkpoint_step": job.checkpoint_step,
        "attempts": job.attempts,
    }


def _jobs(workspace):
    return TrainingJob.objects.for_workspace(workspace).select_related("node", "dataset")


@workspace_page()
def job_list(request: WorkspaceRequest, workspace) -> HttpResponse:
    jobs = list(_jobs(workspace)[:JOBS_SHOWN])
    return render(
        request,
        "training/job_list.html",
        page_context(
            request,
            section="training",
            jobs=jobs,
            rows=[_job_row(j) for j in jobs],
            can_create=role_at_least(request.workspace_role, Role.DEVELOPER),
        ),
    )


def _recommended_initial(workspace, form: JobCreateForm) -> dict[str, int]:
    """Resources of the form's template (the default one unless ``?code=`` picks another) and
    the first dataset on offer, from the scheduler's recommendation (nothing when no similar job
    has finished yet)."""
    from features.models import Dataset
    from training.scheduler.recommend import recommend

    template = form.template
    if not template:
        return {}
    # a ChoiceField; form.fields[...] is typed as the base Field.
    datasets = form.fields["dataset"].choices  # type: ignore[attr-defined]
    dataset = (
        Dataset.objects.for_workspace(workspace).filter(pk=int(datasets[0][0])).first()
        if datasets
        else None
    )
    rec = recommend(workspace=workspace, template=template, dataset=dataset)
    if not rec.get("based_on_jobs"):
        return {}
    return {
        name: rec[name]
        for name in ("cpu_milli", "memory_mb", "gpu_count", "gpu_milli")
        if rec.get(name) is not None
    }


def _job_params_url(workspace) -> str:
    return reverse("training-job-new-params", kwargs={"ws": workspace.slug})


@workspace_page(Role.DEVELOPER)
def job_new(request: WorkspaceRequest, workspace) -> HttpResponse:
    """The new-job form; a valid one is handed to ``job_create`` (the API's service). The
    param fields are the picked template's schema (``?code=template:<name>`` picks one)."""
    url = _job_params_url(workspace)
    if request.method == "POST":
        form = JobCreateForm(request.POST, workspace=workspace, params_url=url)
        if form.is_valid():
            try:
                job = services.job_create(
                    actor=request.user, workspace=workspace, **form.service_arguments()
                )
            except ValidationError as exc:
                put_service_errors(form, exc, form.service_fields)
            except ConflictError as exc:
                form.add_error(exc.attr if exc.attr in form.fields else None, str(exc))
            else:
                messages.success(request, f"Job {job.name} #{job.pk} submitted.")
                return redirect("training-job", ws=workspace.slug, pk=job.pk)
    else:
        form = JobCreateForm(
            workspace=workspace, params_url=url, initial={"code": request.GET.get("code", "")}
        )
        form.initial.update(_recommended_initial(workspace, form))
    return render(
        request,
        "training/job_new.html",
        page_context(request, section="training", form=form),
        status=400 if form.errors else 200,
    )


@workspace_page(Role.DEVELOPER)
def job_new_params(request: WorkspaceRequest, workspace) -> HttpResponse:
    """The new-job form's params fragment for ``?code=``: one field per param of a template's
    schema, prefilled with its defaults, or the free JSON params of an entry point (the form
    swaps it in when the template select changes)."""
    form = JobCreateForm(
        workspace=workspace,
        params_url=_job_params_url(workspace),
        initial={"code": request.GET.get("code", "")},
    )
    return render(request, "training/_job_params.html", {"form": form})


@workspace_page()
def job_list_json(request: WorkspaceRequest, workspace) -> JsonResponse:
    return JsonResponse({"jobs": [_job_row(j) for j in _jobs(workspace)[:JOBS_SHOWN]]})


def _series(workspace, job: TrainingJob) -> dict[str, list[list[float]]]:
    series: dict[str, list[list[float]]] = {}
    rows = (
        JobMetric.objects.for_workspace(workspace)
        .filter(job=job)
        .exclude(name="checkpoint")
        .order_by("name", "step", "id")
        .values_list("name", "step", "value")
    )
    for name, step, value in rows:
        series.setdefault(name, []).append([step, value])
    for name, points in series.items():
        if len(points) > SERIES_POINTS:
            stride = len(points) / SERIES_POINTS
            series[name] = [points[int(i * stride)] for i in range(SERIES_POINTS)] + [points[-1]]
    return series


def _get_job(workspace, pk: int) -> TrainingJob:
    job = _jobs(workspace).filter(pk=pk).first()
    if job is None:
        raise Http404("no such job")
    return job


@workspace_page()
def job_live_json(request: WorkspaceRequest, workspace, pk: int) -> JsonResponse:
    job = _get_job(workspace, pk)
    return JsonResponse({"job": _job_row(job), "series": _series(workspace, job)})


def _log_tail(job: TrainingJob) -> str:
    from training.agent import LOG_FILE
    from training.services import job_work_dir

    path = job_work_dir(job) / LOG_FILE
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - LOG_TAIL_BYTES))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _mlflow_run(job: TrainingJob) -> dict[str, str]:
    """Where a person can open the job's MLflow run: the MLflow UI's run page when a UI is
    configured (``MLFLOW_UI_URL``: the address a browser reaches, which an internal tracking
    URI such as ``http://mlflow:5000`` is not) or the platform serves MLflow itself
    (``/mlflow/w/<slug>``, training.mlflow_server); else the run id and the tracking URI to copy."""
    ui = str(getattr(settings, "MLFLOW_UI_URL", "") or "").rstrip("/")
    ui = ui or mlflow_server.ui_path(job.workspace.slug)
    run_id = job.mlflow_run_id or ""
    return {
        "run_id": run_id,
        "url": f"{ui}/#/runs/{run_id}" if ui and run_id else "",
        "ui": ui,
        "tracking_uri": str(settings.MLFLOW_TRACKING_URI),
    }


# The live curves of the job page: (series name in JobMetric, chart name, label, colour, units).
LIVE_CURVES = [
    ("loss", "loss", "Training loss", "#2563eb", ""),
    ("holdout_auc", "auc", "Held-out AUC", "#059669", ""),
    ("samples_per_s", "rate", "Samples / s", "#d97706", "samples/s"),
    ("val_logloss", "val", "Validation logloss", "#7c3aed", ""),
]


def _live_charts(series: dict[str, list[list[float]]]) -> dict[str, dict]:
    return {
        chart: curves.step_chart(series.get(name) or [], label=label, colour=colour, units=units)
        for name, chart, label, colour, units in LIVE_CURVES
    }


@workspace_page()
def job_page(request: WorkspaceRequest, workspace, pk: int) -> HttpResponse:
    job = _get_job(workspace, pk)
    metrics = job.metrics or {}
    history = (
        Event.objects.for_workspace(workspace)
        .filter(refs__kind=TrainingJob.event_kind, refs__object_id=str(job.pk))
        .filter(verb__startswith="training.job.")
        .order_by("id")
        .distinct()[:200]
    )
    checkpoints = (
        JobMetric.objects.for_workspace(workspace)
        .filter(job=job, name="checkpoint")
        .order_by("-step", "-id")[:50]
    )
    roc = metrics.get("roc") or []
    calibration = metrics.get("calibration") or []
    importance = sorted((metrics.get("importance") or {}).items(), key=lambda item: -item[1])
    top_importance = max([abs(v) for _, v in importance] or [1.0]) or 1.0
    return render(
        request,
        "training/job_detail.html",
        page_context(
            request,
            section="training",
            job=job,
            row=_job_row(job),
            holdout=metrics.get("holdout") or {},
            production=metrics.get("production"),
            slices=sorted((metrics.get("slices") or {}).items()),
            importance=[(ref, value, abs(value) / top_importance) for ref, value in importance],
            roc_chart=curves.roc_chart([("TPR", roc, "#2563eb")]),
            calibration_chart=curves.calibration_chart([("Observed CTR", calibration, "#2563eb")]),
            live_charts=_live_charts(_series(workspace, job)),
            hyperparameters=[
                {**row, "text": param_text(row["value"])} for row in job_hyperparameters(job)
            ],
            cv_hint=small_validation_hint(job),
            history=history,
            checkpoints=checkpoints,
            ranks=_ranks(job),
            trainjob=trainjobs.describe(job) if trainjobs.enabled() else "",
            log_tail=_log_tail(job),
            mlflow=_mlflow_run(job),
            running=job.state
            in {JobState.PENDING, JobState.ADMITTED, JobState.PLACED, JobState.RUNNING},
            model_dir=Path(job.model_path).name if job.model_path else "",
            can_tune=bool(job.template) and role_at_least(request.workspace_role, Role.DEVELOPER),
            can_register=job.state == JobState.SUCCEEDED
            and bool(job.model_path)
            and role_at_least(request.workspace_role, Role.DEVELOPER),
        ),
    )


def _ranks(job: TrainingJob) -> list[dict[str, Any]]:
    """Where each data-parallel rank of a placed job runs (none for a one-process job)."""
    from training.distributed import rank_layout

    if (job.workers or 1) < 2 or not job.node_id:
        return []
    rows = rank_layout(job)
    names = dict(Node.objects.filter(pk__in={r["node"] for r in rows}).values_list("pk", "name"))
    return [{**r, "node_name": names.get(r["node"], f"node {r['node']} (gone)")} for r in rows]


def _run_row(run: PipelineRun) -> dict[str, Any]:
    stages = list(run.stage_runs.all())
    return {
        "id": run.pk,
        "pipeline": run.pipeline.name,
        "state": run.state,
        "error": run.error,
        "stages": [
            {"name": s.name, "kind": s.kind, "state": s.state, "error": s.error} for s in stages
        ],
    }


def _dag_layout(pipeline: Pipeline, states: dict[str, str] | None = None) -> dict[str, Any]:
    """Boxes by depth (column) for the DAG drawing, each with its state in the pipeline's
    latest run (``states``); edges as coordinates."""
    states = states or {}
    depth: dict[str, int] = {}
    for stage in pipeline.stages:
        depth[stage["name"]] = 1 + max((depth[a] for a in stage.get("after", [])), default=-1)
    columns: dict[int, int] = {}
    boxes = []
    for stage in pipeline.stages:
        column = depth[stage["name"]]
        row = columns.get(column, 0)
        columns[column] = row + 1
        boxes.append(
            {
                "name": stage["name"],
                "kind": stage["kind"],
                "state": states.get(stage["name"], ""),
                "x": 10 + column * 170,
                "y": 10 + row * 60,
            }
        )
    where = {b["name"]: b for b in boxes}
    edges = [
        {
            "x1": where[a]["x"] + 140,
            "y1": where[a]["y"] + 20,
            "x2": where[s["name"]]["x"],
            "y2": where[s["name"]]["y"] + 20,
        }
        for s in pipeline.stages
        for a in s.get("after", [])
    ]
    width = 20 + (max(depth.values(), default=0) + 1) * 170
    height = 20 + max(columns.values(), default=1) * 60
    return {"boxes": boxes, "edges": edges, "width": width, "height": height}


@workspace_page()
def pipeline_list(
    request: WorkspaceRequest, workspace, run_form=None, create_form=None
) -> HttpResponse:
    pipelines = list(Pipeline.objects.for_workspace(workspace))
    runs = (
        PipelineRun.objects.for_workspace(workspace)
        .select_related("pipeline")
        .prefetch_related("stage_runs")[:30]
    )
    candidates = CandidateEvaluation.objects.for_workspace(workspace).select_related("dataset")[:30]
    latest: dict[int, dict[str, str]] = {}
    for run in runs:  # newest first: the first run of each pipeline is its latest
        if run.pipeline_id not in latest:
            latest[run.pipeline_id] = {st.name: st.state for st in run.stage_runs.all()}
    return render(
        request,
        "training/pipelines.html",
        page_context(
            request,
            section="training",
            pipelines=[(p, _dag_layout(p, latest.get(p.pk))) for p in pipelines],
            runs=[_run_row(r) for r in runs],
            candidates=candidates,
            can_run=role_at_least(request.workspace_role, Role.DEVELOPER),
            run_form=run_form or PipelineRunForm(workspace=workspace),
            create_form=create_form or PipelineCreateForm(),
            default_stages=[s["name"] for s in pipeline_services.DEFAULT_STAGES],
        ),
        status=400 if any(f is not None and f.errors for f in (run_form, create_form)) else 200,
    )


@require_POST
@workspace_page(Role.DEVELOPER)
def pipeline_new(request: WorkspaceRequest, workspace) -> HttpResponse:
    """Create a pipeline from the default stages (``pipeline_create``, as the API)."""
    form = PipelineCreateForm(request.POST)
    if form.is_valid():
        try:
            pipeline = pipeline_services.pipeline_create(
                actor=request.user,
                workspace=workspace,
                name=form.cleaned_data["name"],
                description=form.cleaned_data["description"],
            )
        except ValidationError as exc:
            put_service_errors(form, exc, {})
        except ConflictError as exc:
            form.add_error(exc.attr if exc.attr in form.fields else None, str(exc))
        else:
            messages.success(request, f"Pipeline {pipeline.name} created.")
            return redirect("training-pipelines", ws=workspace.slug)
    return pipeline_list(request, workspace.slug, create_form=form)


@require_POST
@workspace_page(Role.DEVELOPER)
def pipeline_run_new(request: WorkspaceRequest, workspace) -> HttpResponse:
    """Start a run of one of the workspace's pipelines (``pipeline_run_start``, as the API)."""
    from training.api.views import check_dataset_params

    form = PipelineRunForm(request.POST, workspace=workspace)
    if form.is_valid():
        pipeline = Pipeline.objects.for_workspace(workspace).get(name=form.cleaned_data["pipeline"])
        try:
            check_dataset_params(workspace, form.cleaned_data["params"], attr="params")
            run = pipeline_services.pipeline_run_start(
                actor=request.user, pipeline=pipeline, params=form.cleaned_data["params"]
            )
        except ValidationError as exc:
            put_service_errors(form, exc, {})
        else:
            messages.success(request, f"Pipeline run #{run.pk} of {pipeline.name} started.")
            return redirect("training-pipelines", ws=workspace.slug)
    return pipeline_list(request, workspace.slug, run_form=form)


@require_POST
@workspace_page(Role.DEVELOPER)
def pipeline_run_retry(request: WorkspaceRequest, workspace, pk: int) -> HttpResponse:
    """Rerun a failed run from its first failed stage (``pipeline_run_retry``, as the API)."""
    run = PipelineRun.objects.for_workspace(workspace).filter(pk=pk).first()
    if run is None:
        raise Http404("no such pipeline run")
    try:
        pipeline_services.pipeline_run_retry(actor=request.user, run=run)
    except ConflictError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Pipeline run #{run.pk} retried from its failed stage.")
    return redirect("training-pipelines", ws=workspace.slug)


@workspace_page()
def pipeline_runs_json(request: WorkspaceRequest, workspace) -> JsonResponse:
    runs = (
        PipelineRun.objects.for_workspace(workspace)
        .select_related("pipeline")
        .prefetch_related("stage_runs")[:30]
    )
    return JsonResponse({"runs": [_run_row(r) for r in runs]})


def dashboard_section(*, workspace, user):
    """The "Training jobs" card: counts by state and the latest jobs (one query each)."""
    from django.db.models import Count

    from workspaces.dashboard import DashboardSection

    counts = dict(
        TrainingJob.objects.for_workspace(workspace)
        .values_list("state")
        .annotate(n=Count("id"))
        .values_list("state", "n")
    )
    latest = list(_jobs(workspace)[:5])
    return DashboardSection(
        template="training/_dashboard_section.html",
        context={
            "workspace": workspace,
            "counts": counts,
            "running": counts.get(JobState.RUNNING, 0),
            "total": sum(counts.values()),
            "latest": [_job_row(j) for j in latest],
        },
    )
