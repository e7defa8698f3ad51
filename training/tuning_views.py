"""Browser UI of tuning jobs: the list, the "Tune" form (template, search space as JSON with the
template's default shown, budget, parallelism, metric), and a tuning job's page: progress, a
sortable table of its trials, their validation curves overlaid and Optuna's parameter
importances. The writes are ``training.tuning``'s services, as in the API."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from training import curves, tuning
from training.forms import TuningCreateForm, put_service_errors
from training.models import TrainingJob, TrialState, TuningJob, TuningTrial
from training.params import param_text
from workspaces.exceptions import ConflictError
from workspaces.models import Event, Role
from workspaces.selectors import role_at_least
from workspaces.views import WorkspaceRequest, page_context, workspace_page

SHOWN = 100
METRIC_LABELS = {"logloss": "Validation logloss", "auc": "Validation AUC"}


def _tuning_jobs(workspace):
    return (
        TuningJob.objects.for_workspace(workspace)
        .select_related("dataset", "best_trial", "refit_job")
        .prefetch_related("trials")
    )


def _progress(tj: TuningJob) -> dict[str, Any]:
    trials = list(tj.trials.all())
    done = sum(1 for t in trials if t.state != TrialState.RUNNING)
    return {
        "started": len(trials),
        "done": done,
        "budget": tj.n_trials,
        "share": min(1.0, done / tj.n_trials) if tj.n_trials else 0.0,
    }


@workspace_page()
def tuning_list(request: WorkspaceRequest, workspace) -> HttpResponse:
    jobs = list(_tuning_jobs(workspace)[:SHOWN])
    return render(
        request,
        "training/tuning_list.html",
        page_context(
            request,
            section="training",
            rows=[(tj, _progress(tj)) for tj in jobs],
            can_create=role_at_least(request.workspace_role, Role.DEVELOPER),
        ),
    )


@workspace_page(Role.DEVELOPER)
def tuning_new(request: WorkspaceRequest, workspace) -> HttpResponse:
    """The Tune form; ``?base_job=<id>`` copies a job's template, dataset, params, resources."""
    base_job = None
    base_id = request.GET.get("base_job", "")
    if base_id:
        base_job = (
            TrainingJob.objects.for_workspace(workspace)
            .filter(pk=int(base_id) if base_id.isdigit() else 0)
            .first()
        )
        if base_job is None or not base_job.template:
            raise Http404("no such job (with a built-in template) in this workspace")
    initial = {"template": request.GET.get("template", "")}
    if request.method == "POST":
        form = TuningCreateForm(request.POST, workspace=workspace, base_job=base_job)
        if form.is_valid():
            try:
                created = tuning.tuning_job_create(
                    actor=request.user, workspace=workspace, **form.service_arguments()
                )
            except ValidationError as exc:
                put_service_errors(form, exc, {})
            else:
                messages.success(request, f"Tuning job {created.name} #{created.pk} started.")
                return redirect("training-tuning-job", ws=workspace.slug, pk=created.pk)
    else:
        form = TuningCreateForm(workspace=workspace, base_job=base_job, initial=initial)
    return render(
        request,
        "training/tuning_new.html",
        page_context(
            request,
            section="training",
            form=form,
            base_job=base_job,
            default_spaces=form.default_spaces,
        ),
        status=400 if form.errors else 200,
    )


def _get(workspace, pk: int) -> TuningJob:
    found = _tuning_jobs(workspace).filter(pk=pk).first()
    if found is None:
        raise Http404("no such tuning job")
    return found


def _param_text(value: Any) -> str:
    """A sampled value as a person reads it: floats to 4 significant digits."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return param_text(value)


def _trial_rows(trials: list[TuningTrial]) -> list[dict[str, Any]]:
    return [
        {
            "number": t.number,
            "state": t.state,
            "value": t.value,
            "epochs": len(t.intermediate or []),
            "params": [(name, _param_text(value)) for name, value in sorted(t.params.items())],
            "job": t.job,
        }
        for t in trials
    ]


def _curve_chart(tj: TuningJob, trials: list[TuningTrial]) -> dict[str, Any]:
    labelled = [
        (
            f"Trial {t.number}" + ("" if t.state == TrialState.COMPLETE else f" ({t.state})"),
            t.intermediate or [],
        )
        for t in trials
    ]
    return curves.epoch_overlay(labelled)


@workspace_page()
def tuning_page(request: WorkspaceRequest, workspace, pk: int) -> HttpResponse:
    tj = _get(workspace, pk)
    trials = list(
        TuningTrial.objects.for_workspace(workspace)
        .filter(tuning_job=tj)
        .select_related("job")
        .order_by("number")
    )
    importances = tuning.tuning_importances(tj, trials)
    top = max(importances.values(), default=1.0) or 1.0
    history = (
        Event.objects.for_workspace(workspace)
        .filter(refs__kind=TuningJob.event_kind, refs__object_id=str(tj.pk))
        .filter(verb__startswith="training.tuning_job.")
        .order_by("id")
        .distinct()[:50]
    )
    return render(
        request,
        "training/tuning_detail.html",
        page_context(
            request,
            section="training",
            tj=tj,
            progress=_progress(tj),
            trials=_trial_rows(trials),
            space=[(name, spec) for name, spec in sorted(tj.space.items())],
            fixed=[(name, param_text(value)) for name, value in sorted(tj.params.items())],
            curve_chart=_curve_chart(tj, trials),
            metric_label=METRIC_LABELS.get(tj.metric, tj.metric),
            importances=[(name, value, value / top) for name, value in importances.items()],
            complete=sum(1 for t in trials if t.state == TrialState.COMPLETE),
            history=history,
            running=not tj.is_terminal,
            can_cancel=not tj.is_terminal and role_at_least(request.workspace_role, Role.DEVELOPER),
        ),
    )


@require_POST
@workspace_page(Role.DEVELOPER)
def tuning_cancel(request: WorkspaceRequest, workspace, pk: int) -> HttpResponse:
    tj = _get(workspace, pk)
    try:
        tuning.tuning_job_cancel(actor=request.user, tuning_job=tj)
    except ConflictError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Tuning job {tj.name} cancelled; its trials are stopping.")
    return redirect("training-tuning-job", ws=workspace.slug, pk=tj.pk)
