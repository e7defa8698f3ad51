"""REST routes of the experiments app, included under /api/v1/."""

from rest_framework.routers import SimpleRouter

from experiments.api.views import ExperimentViewSet, FeedbackViewSet, LayerViewSet, LoopViewSet

WS = r"workspaces/(?P<ws>[a-z0-9-]+)"

router = SimpleRouter()
router.register(rf"{WS}/experiments", ExperimentViewSet, basename="experiment")
router.register(rf"{WS}/experiment-layers", LayerViewSet, basename="experiment-layer")
router.register(rf"{WS}/feedback", FeedbackViewSet, basename="feedback")
router.register(rf"{WS}/loops", LoopViewSet, basename="loop")

urlpatterns = router.urls
