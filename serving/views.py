"""Browser UI of serving: models, a version's page (metrics, gates, artifacts), deployments with
charts (QPS, latency histogram, errors, version mix) and a rollback button; ``/metrics``."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import Max
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serving.deployments import deployment_rollback
from serving.models import Deployment, DeploymentChange, ModelVersion, RegisteredModel
from serving.observability import deployment_stats
from workspaces.exceptions import ConflictError
from workspaces.models import Role
from workspaces.selectors import role_at_least
from workspaces.views import _context, workspace_page


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition of this process (set METRICS_TOKEN to require a bearer token)."""
    token = getattr(settings, "METRICS_TOKEN", "")
    if token and request.headers.get("Authorization", "") != f"Bearer {token}":
        return HttpResponse(status=401)
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)


@workspace_page()
def model_list(request: HttpRequest, workspace) -> HttpResponse:
    models = RegisteredModel.objects.for_workspace(workspace).annotate(
        latest=Max("versions__version")
    )
    versions = (
        ModelVersion.objects.for_workspace(workspace)
        .select_related("model")
        .order_by("-created_at")[:50]
    )
    return render(
        request,
        "serving/model_list.html",
        _context(request, section="serving", models=models, versions=versions),
    )


@workspace_page()
def version_detail(request: HttpRequest, workspace, name: str, version: int) -> HttpResponse:
    found = (
        ModelVersion.objects.for_workspace(workspace)
        .select_related("model", "job", "dataset")
        .filter(model__name=name, version=version)
        .first()
    )
    if found is None:
        raise Http404("No such model version.")
    metrics_rows = sorted(
        (k, v) for k, v in (found.metrics or {}).items() if isinstance(v, (int, float))
    )
    importance = sorted(
        ((k, v) for k, v in (found.importance or {}).items() if isinstance(v, (int, float))),
        key=lambda kv: -abs(kv[1]),
    )[:30]
    return render(
        request,
        "serving/version_detail.html",
        _context(
            request,
            section="serving",
            version=found,
            metrics_rows=metrics_rows,
            importance=importance,
            gates=sorted((k, v) for k, v in (found.gates or {}).items() if k != "run"),
            gates_run=(found.gates or {}).get("run"),
        ),
    )


@workspace_page()
def deployment_list(request: HttpRequest, workspace) -> HttpResponse:
    deployments = Deployment.objects.for_workspace(workspace).select_related(
        "model", "version", "previous_version"
    )
    return render(
        request,
        "serving/deployment_list.html",
        _context(request, section="serving", deployments=deployments),
    )


@workspace_page()
def deployment_detail(request: HttpRequest, workspace, name: str) -> HttpResponse:
    dep = (
        Deployment.objects.for_workspace(workspace)
        .select_related("model", "version", "previous_version")
        .filter(name=name)
        .first()
    )
    if dep is None:
        raise Http404("No such deployment.")
    can_release = role_at_least(request.workspace_role, Role.MAINTAINER)
    if request.method == "POST":
        if not can_release:
            raise Http404("No such deployment.")
        try:
            deployment_rollback(
                actor=request.user,
                workspace=workspace,
                deployment=dep,
                reason=request.POST.get("reason", "").strip()[:500],
            )
            messages.success(request, "Rolled back: traffic moves to the previous version.")
        except (ValidationError, ConflictError) as exc:
            messages.error(request, " ".join(getattr(exc, "messages", [str(exc)])))
        return redirect("serving-deployment", ws=workspace.slug, name=dep.name)
    changes = (
        DeploymentChange.objects.for_workspace(workspace)
        .filter(deployment=dep)
        .select_related("actor", "from_version", "to_version")[:30]
    )
    return render(
        request,
        "serving/deployment_detail.html",
        _context(
            request,
            section="serving",
            dep=dep,
            stats=deployment_stats(dep),
            changes=changes,
            can_release=can_release,
        ),
    )
