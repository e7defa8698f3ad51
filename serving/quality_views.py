"""The version page's quality-gate override (a maintainer's reason; the same service as
``POST .../model-versions/{id}/quality-override/``)."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from serving import quality
from serving.models import ModelVersion
from workspaces.exceptions import ConflictError
from workspaces.models import Role
from workspaces.views import WorkspaceRequest, workspace_page


@require_POST
@workspace_page(Role.MAINTAINER)
def version_quality_override(request: WorkspaceRequest, workspace, name: str, version: int):
    found = (
        ModelVersion.objects.for_workspace(workspace)
        .select_related("model")
        .filter(model__name=name, version=version)
        .first()
    )
    if found is None:
        raise Http404("no such model version")
    try:
        quality.quality_override(
            actor=request.user,
            workspace=workspace,
            version=found,
            reason=request.POST.get("reason", ""),
        )
    except (ValidationError, ConflictError) as exc:
        text = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        messages.error(request, text)
    else:
        messages.success(request, f"Quality gate overridden for {found}; flagged for audit.")
    return redirect("serving-version", ws=workspace.slug, name=name, version=version)
