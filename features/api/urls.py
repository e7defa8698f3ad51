"""Routes of the features app under /api/v1/workspaces/{ws}/."""

from django.urls import re_path
from rest_framework.routers import SimpleRouter

from features.api import views
from features.api.datasets import DatasetViewSet, SampleStreamFeaturesViewSet
from features.api.feast import FeastViewSet
from features.api.health import FeatureGroupHealthViewSet

WS = r"workspaces/(?P<ws>[a-z0-9-]+)"
GROUP = WS + r"/feature-groups/(?P<name>[a-z][a-z0-9_]*)"

router = SimpleRouter()
router.register(rf"{WS}/feature-groups", views.FeatureGroupViewSet, basename="feature-group")
router.register(rf"{GROUP}/features", views.FeatureViewSet, basename="feature")
router.register(rf"{GROUP}/batches", views.BatchViewSet, basename="feature-batch")
router.register(rf"{GROUP}/health", FeatureGroupHealthViewSet, basename="feature-group-health")
router.register(rf"{WS}/online-features", views.OnlineFeaturesViewSet, basename="online-features")
router.register(rf"{WS}/datasets", DatasetViewSet, basename="dataset")
router.register(rf"{WS}/feast", FeastViewSet, basename="feast")
router.register(
    rf"{WS}/sample-stream/features",
    SampleStreamFeaturesViewSet,
    basename="sample-stream-feature",
)

urlpatterns = [
    # Feast's remote online store posts to <path>/get-online-features (no trailing slash).
    re_path(
        rf"^{WS}/feast/get-online-features$",
        FeastViewSet.as_view({"post": "online_features"}),
        name="feast-get-online-features",
    ),
    *router.urls,
]
