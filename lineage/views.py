"""Browser UI of the lineage app: the interactive graph page and the dashboard cost card."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Subquery, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from lineage import cost
from lineage.models import Node, Usage
from lineage.projection import catch_up
from workspaces.dashboard import DashboardSection
from workspaces.views import _context, workspace_page

START_KINDS = ("experiment", "deployment", "model_version", "feature_group")


def lineage_url(workspace_slug: str, kind: str, object_id) -> str:
    """The graph page centred on one object: for links from other apps' pages."""
    return f"{reverse('lineage-graph', kwargs={'ws': workspace_slug})}?node={kind}:{object_id}"


@workspace_page()
def graph_page(request: HttpRequest, workspace) -> HttpResponse:
    catch_up()
    key = request.GET.get("node", "")
    if not key:
        start = None
        for kind in START_KINDS:
            start = Node.objects.for_workspace(workspace).filter(kind=kind).order_by("-id").first()
            if start is not None:
                break
        key = start.key if start is not None else ""
    node = None
    if key:
        kind, _, object_id = key.partition(":")
        node = Node.objects.for_workspace(workspace).filter(kind=kind, object_id=object_id).first()
    node_cost = cost.cost_of(workspace=workspace, node=node) if node is not None else None
    return render(
        request,
        "lineage/graph.html",
        _context(
            request,
            section="lineage",
            node=node,
            node_key=key,
            node_cost=node_cost,
            api_url=reverse("v1:lineage-list", kwargs={"ws": workspace.slug}),
            workspace_cost=cost.workspace_cost(workspace=workspace, days=30),
            top=cost.top_costs(
                workspace=workspace, kinds=("training_job", "deployment", "experiment")
            ),
        ),
    )


def dashboard_section(*, workspace, user) -> DashboardSection:
    """The "Lineage" card: graph size and the last 30 days' cost, in one query (the dashboard's
    query budget is shared by every card)."""
    kinds = ("feature_group", "dataset", "training_job", "model_version", "deployment")
    since = timezone.now() - timedelta(days=30)
    spent = (
        Usage.objects.filter(workspace_id=workspace.pk, created_at__gte=since)
        .values("workspace_id")
        .annotate(cost=Sum("cost"), cpu=Sum("cpu_hours"), gpu=Sum("gpu_hours"))
    )
    rows = (
        Node.objects.for_workspace(workspace)
        .filter(kind__in=kinds)
        .values("kind")
        .annotate(
            n=Count("id"),
            cost=Subquery(spent.values("cost")),
            cpu=Subquery(spent.values("cpu")),
            gpu=Subquery(spent.values("gpu")),
        )
        .order_by()
    )
    counts = dict.fromkeys(kinds, 0)
    total = {"cost": 0.0, "cpu_hours": 0.0, "gpu_hours": 0.0}
    for row in rows:
        counts[row["kind"]] = row["n"]
        total = {
            "cost": row["cost"] or 0.0,
            "cpu_hours": row["cpu"] or 0.0,
            "gpu_hours": row["gpu"] or 0.0,
        }
    return DashboardSection(
        template="lineage/_dashboard_section.html",
        context={"workspace": workspace, "counts": counts, "total": total},
    )
