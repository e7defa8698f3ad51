"""Routes of the workspaces app under /api/v1/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from workspaces.api import views, webhooks

WS = r"workspaces/(?P<ws>[a-z0-9-]+)"

router = SimpleRouter()
router.register("auth/tokens", views.ApiTokenViewSet, basename="api-token")
router.register("workspaces", views.WorkspaceViewSet, basename="workspace")
router.register(rf"{WS}/members", views.MemberViewSet, basename="member")
router.register(rf"{WS}/activity", views.ActivityViewSet, basename="activity")
router.register(rf"{WS}/service-accounts", views.ServiceAccountViewSet, basename="service-account")
router.register(rf"{WS}/webhooks", webhooks.WebhookViewSet, basename="webhook")
router.register("notifications", webhooks.NotificationViewSet, basename="notification")

urlpatterns = [
    path("auth/token/", views.TokenObtainView.as_view(), name="auth-token"),
    *router.urls,
]
