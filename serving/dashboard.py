"""The "Models" card of the workspace dashboard: registered models, versions and deployments."""

from __future__ import annotations

from django.db.models import Count

from serving.models import Deployment, DeploymentState, RegisteredModel
from workspaces.dashboard import DashboardSection

LATEST_SHOWN = 5


def dashboard_section(*, workspace, user) -> DashboardSection:
    """Counts of models, versions and deployments (by state) and the live deployments, with
    what each one serves; three queries whatever the workspace holds."""
    totals = RegisteredModel.objects.for_workspace(workspace).aggregate(
        models=Count("id", distinct=True), versions=Count("versions")
    )
    by_state = dict(
        Deployment.objects.for_workspace(workspace)
        .order_by()
        .values_list("state")
        .annotate(n=Count("id"))
        .values_list("state", "n")
    )
    live = list(
        Deployment.objects.for_workspace(workspace)
        .filter(state=DeploymentState.ACTIVE)
        .select_related("model", "version")
        .order_by("-updated_at", "-id")[:LATEST_SHOWN]
    )
    return DashboardSection(
        template="serving/_dashboard_section.html",
        context={
            "workspace": workspace,
            "models": totals["models"],
            "versions": totals["versions"],
            "deployments": sum(by_state.values()),
            "active": by_state.get(DeploymentState.ACTIVE, 0),
            "stopped": by_state.get(DeploymentState.STOPPED, 0),
            "live": [
                {
                    "name": d.name,
                    "model": d.model.name,
                    "version": d.version.version if d.version else None,
                }
                for d in live
            ],
        },
    )
