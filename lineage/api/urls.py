"""REST routes of the lineage app, included under /api/v1/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from lineage.api.views import LineageViewSet, OpenLineageIntakeView

WS = r"workspaces/(?P<ws>[a-z0-9-]+)"

router = SimpleRouter()
router.register(rf"{WS}/lineage", LineageViewSet, basename="lineage")

urlpatterns = [
    # The OpenLineage HTTP transport posts to <url>/api/v1/lineage (no trailing slash).
    path("lineage", OpenLineageIntakeView.as_view(), name="openlineage-intake"),
    *router.urls,
]
