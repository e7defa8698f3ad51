"""Routes of data building under /api/v1/workspaces/{ws}/."""

from rest_framework.routers import SimpleRouter

from curation.api.annotation import AnnotationTaskViewSet
from curation.api.views import RecordSetViewSet

WS = r"workspaces/(?P<ws>[a-z0-9-]+)"

router = SimpleRouter()
router.register(rf"{WS}/record-sets", RecordSetViewSet, basename="record-set")
router.register(rf"{WS}/annotation-tasks", AnnotationTaskViewSet, basename="annotation-task")

urlpatterns = router.urls
