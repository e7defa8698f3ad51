"""Browser UI of the one action: "Try in an A/B experiment" (a POST from a feature group's page
or a finished candidate evaluation), the loops list and a loop's live page (each stage with its
state, seconds and linked object; a failed stage says why and offers retry from it; a failed
quality gate offers a maintainer the override with a reason). Same services and roles as
``/api/v1/workspaces/{ws}/loops/``."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from experiments import loop
from workspaces.exceptions import ConflictError
from workspaces.models import Role
from workspaces.selectors import role_at_least
from workspaces.views import WorkspaceRequest, page_context, workspace_page

STAGE_TITLES = {
    "add_feature": "Add to the sample stream",
    "build_samples": "Build samples",
    "train": "Train",
    "evaluate": "Evaluate",
    "quality_gate": "Quality gate",
    "register": "Register",
    "release_gates": "Release gates",
    "challenger": "Deploy as challenger",
    "experiment": "Start the A/B experiment",
}


def _run(workspace, pk: int):
    run = loop.loops_of(workspace).filter(pk=pk).first()
    if run is None:
        raise Http404("no such loop")
    return run


def _choices(workspace) -> dict:
    from features.selectors import feature_groups_of
    from serving.models import Deployment

    return {
        "groups": list(feature_groups_of(workspace=workspace).values_list("name", flat=True)),
        "deployments": list(
            Deployment.objects.for_workspace(workspace)
            .order_by("name")
            .values_list("name", flat=True)
        ),
    }


def _errors(exc: Exception) -> dict[str, list[str]]:
    if isinstance(exc, ValidationError) and hasattr(exc, "message_dict"):
        return {k: list(v) for k, v in exc.message_dict.items()}
    return {getattr(exc, "attr", None) or "form": [str(exc)]}


@workspace_page()
def loop_list(request: WorkspaceRequest, workspace) -> HttpResponse:
    runs = list(loop.loops_of(workspace).prefetch_related("stage_runs")[:50])
    return render(
        request,
        "experiments/loop_list.html",
        page_context(
            request,
            loops=[loop.loop_summary(run, links=False) for run in runs],
            can_develop=role_at_least(request.workspace_role, Role.DEVELOPER),
            titles=STAGE_TITLES,
            **_choices(workspace),
        ),
    )


@workspace_page(Role.DEVELOPER)
def loop_new(request: WorkspaceRequest, workspace) -> HttpResponse:
    """GET: the form (group and deployment picked from the workspace's); POST: start the loop
    and go to its live page, or show the error next to the field."""
    data = request.POST or request.GET
    values = {
        "group": data.get("group", ""),
        "deployment": data.get("deployment", ""),
        "evaluation": data.get("evaluation", ""),
    }
    errors: dict[str, list[str]] = {}
    if request.method == "POST":
        try:
            evaluation = values["evaluation"]
            if evaluation and not evaluation.isdigit():
                raise ValidationError({"evaluation": "a candidate evaluation id"})
            run = loop.loop_start(
                actor=request.user,
                workspace=workspace,
                group=values["group"] or None,
                deployment=values["deployment"] or None,
                evaluation=int(evaluation) if evaluation else None,
            )
        except (ValidationError, ConflictError) as exc:
            errors = _errors(exc)
        else:
            messages.success(request, f"Loop #{run.pk} started for {run.params['group']}.")
            return redirect("experiments-loop", ws=workspace.slug, pk=run.pk)
    return render(
        request,
        "experiments/loop_new.html",
        page_context(
            request,
            values=values,
            errors=errors,
            policy=loop.loop_policy(workspace),
            stage_titles=[STAGE_TITLES[s["name"]] for s in loop.LOOP_STAGES],
            **_choices(workspace),
        ),
        status=400 if errors else 200,
    )


def _page_context(request, run) -> dict:
    summary = loop.loop_summary(run)
    for stage in summary["stages"]:
        stage["title"] = STAGE_TITLES.get(stage["name"], stage["name"])
    done = sum(1 for s in summary["stages"] if s["state"] == "succeeded")
    return page_context(
        request,
        run=run,
        loop=summary,
        done=done,
        total=len(summary["stages"]),
        live=summary["state"] == "running",
        can_develop=role_at_least(request.workspace_role, Role.DEVELOPER),
        can_release=role_at_least(request.workspace_role, Role.MAINTAINER),
    )


@workspace_page()
def loop_page(request: WorkspaceRequest, workspace, pk: int) -> HttpResponse:
    run = _run(workspace, pk)
    if request.headers.get("HX-Request"):
        return render(request, "experiments/_loop_stages.html", _page_context(request, run))
    return render(request, "experiments/loop_detail.html", _page_context(request, run))


@require_POST
@workspace_page(Role.DEVELOPER)
def loop_retry(request: WorkspaceRequest, workspace, pk: int) -> HttpResponse:
    run = _run(workspace, pk)
    reason = request.POST.get("quality_override", "").strip()
    if reason and not role_at_least(request.workspace_role, Role.MAINTAINER):
        raise PermissionDenied("only a maintainer may override the quality gate")
    if "quality_override" in request.POST and not reason:
        messages.error(request, "Say why the candidate may go on despite the quality gate.")
        return redirect("experiments-loop", ws=workspace.slug, pk=run.pk)
    try:
        loop.loop_retry(actor=request.user, run=run, quality_override=reason)
    except ConflictError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request,
            "Quality gate overridden; the loop goes on." if reason else "Retrying the loop.",
        )
    return redirect("experiments-loop", ws=workspace.slug, pk=run.pk)
