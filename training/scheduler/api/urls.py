"""Routes of the scheduler under /api/v1/workspaces/{ws}/scheduler/."""

from rest_framework.routers import SimpleRouter

from training.scheduler.api import views

WS = r"workspaces/(?P<ws>[a-z0-9-]+)"

router = SimpleRouter()
router.register(rf"{WS}/scheduler/queue", views.QueueViewSet, basename="scheduler-queue")
router.register(
    rf"{WS}/scheduler/recommendation",
    views.RecommendationViewSet,
    basename="scheduler-recommendation",
)
router.register(rf"{WS}/scheduler/quotas", views.QuotaViewSet, basename="scheduler-quota")
router.register(
    rf"{WS}/scheduler/quota-requests",
    views.QuotaRequestViewSet,
    basename="scheduler-quota-request",
)

urlpatterns = router.urls
