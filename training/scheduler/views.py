"""Browser UI of the scheduler: the workspace queue (with its quota recommendation), its
dashboard card and, for staff, the cluster."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from training import trainjobs
from training.scheduler import selectors
from training.scheduler.lending import utilisation
from training.scheduler.recommend import recommend, savings_report
from workspaces.dashboard import DashboardSection
from workspaces.views import WorkspaceRequest, page_context, workspace_page


@workspace_page()
def queue_page(request: WorkspaceRequest, workspace) -> HttpResponse:
    rows = selectors.queue_of(workspace=workspace)
    groups = {
        "waiting": [r for r in rows if r["state"] in ("pending", "admitted", "preempted")],
        "running": [r for r in rows if r["state"] in ("placed", "running")],
    }
    return render(
        request,
        "scheduler/queue.html",
        page_context(
            request,
            section="queue",
            rows=rows,
            groups=groups,
            quota=selectors.quota_summary(workspace=workspace),
            savings=savings_report(workspace=workspace),
        ),
    )


def dashboard_section(*, workspace, user) -> DashboardSection:
    """The dashboard's "Quota" card: the same function and partial as the queue page."""
    return DashboardSection(
        template="scheduler/_dashboard_section.html",
        context={"workspace": workspace, "quota": selectors.quota_summary(workspace=workspace)},
    )


@staff_member_required
def cluster_page(request: HttpRequest) -> HttpResponse:
    overview = selectors.cluster_overview()
    return render(
        request,
        "scheduler/cluster.html",
        {
            "overview": overview,
            "lending": utilisation(days=7),
            "section": "cluster",
            "kueue": {"namespace": trainjobs.namespace()} if trainjobs.enabled() else None,
        },
    )


@workspace_page()
def recommendation_partial(request: WorkspaceRequest, workspace) -> HttpResponse:
    """An HTML fragment for the job submit form (``hx-get`` with ``template`` and ``dataset``)."""
    from features.models import Dataset

    template = request.GET.get("template", "").strip()
    dataset = None
    raw = request.GET.get("dataset", "").strip()
    if raw.isdigit():
        dataset = Dataset.objects.for_workspace(workspace).filter(pk=int(raw)).first()
    rec = recommend(workspace=workspace, template=template, dataset=dataset) if template else None
    return render(request, "scheduler/_recommendation.html", {"rec": rec, "template": template})
