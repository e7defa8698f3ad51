"""Browser UI of notebooks: "Open notebook" on the workspace page starts (or finds) the
member's JupyterLab server and sends them to this page, which shows it starting and then opens
JupyterLab; "Stop" ends it. The writes are ``training.notebooks``'s services, as in the API."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from training import notebooks
from training.models import NotebookServer
from workspaces.exceptions import ConflictError
from workspaces.views import WorkspaceRequest, page_context, workspace_page


@workspace_page()
def notebook_page(request: WorkspaceRequest, workspace) -> HttpResponse:
    servers = notebooks.notebooks_of(workspace, request.user)
    live = next((server for server in servers if server.is_live), None)
    return render(
        request,
        "training/notebook.html",
        page_context(
            request,
            section="notebook",
            live=live,
            url=notebooks.notebook_url(live, request.get_host())
            if live is not None and live.state == "running"
            else "",
            past=[server for server in servers if not server.is_live][:10],
            idle_minutes=notebooks.idle_timeout_s() // 60,
        ),
    )


@require_POST
@workspace_page()
def notebook_open(request: WorkspaceRequest, workspace) -> HttpResponse:
    try:
        server, started = notebooks.notebook_open(
            actor=request.user, workspace=workspace, platform_url=request.build_absolute_uri("/")
        )
    except ConflictError as exc:
        messages.error(request, str(exc))
    else:
        if server.state == "failed":
            messages.error(request, f"The notebook server could not start: {server.stop_reason}")
        elif started:
            messages.success(request, "Starting your notebook server.")
    return redirect("training-notebook", ws=workspace.slug)


@require_POST
@workspace_page()
def notebook_stop(request: WorkspaceRequest, workspace, pk: int) -> HttpResponse:
    server = (
        NotebookServer.objects.for_workspace(workspace).filter(user=request.user, pk=pk).first()
    )
    if server is None:
        raise Http404("no such notebook server of yours")
    try:
        notebooks.notebook_stop(actor=request.user, server=server)
    except ConflictError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Notebook server stopped; its token is revoked.")
    return redirect("training-notebook", ws=workspace.slug)
