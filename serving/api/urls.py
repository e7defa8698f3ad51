"""REST routes of the serving app, included under /api/v1/."""

from django.urls import re_path
from rest_framework.routers import SimpleRouter

from serving import gateway
from serving.api import benchmarks, views
from serving.api.review import ReviewViewSet

WS = r"workspaces/(?P<ws>[a-z0-9-]+)"

router = SimpleRouter()
router.register(rf"{WS}/models", views.RegisteredModelViewSet, basename="serving-model")
router.register(rf"{WS}/model-versions", views.ModelVersionViewSet, basename="serving-version")
router.register(rf"{WS}/deployments", views.DeploymentViewSet, basename="serving-deployment")
router.register(rf"{WS}/benchmarks", benchmarks.BenchmarkSetViewSet, basename="serving-benchmark")
router.register(
    rf"{WS}/benchmark-scores", benchmarks.BenchmarkScoreViewSet, basename="serving-benchmark-score"
)
# Blind side-by-side human reviews of two language-model versions (serving.review).
router.register(rf"{WS}/reviews", ReviewViewSet, basename="serving-review")

urlpatterns = [
    # The gateway's lean hot path: a plain Django view (no DRF), see serving/gateway.py.
    re_path(rf"^{WS}/predict/$", gateway.predict, name="serving-predict"),
    *router.urls,
]
