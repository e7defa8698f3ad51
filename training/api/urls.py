"""REST routes of the training app, included under /api/v1/."""

from rest_framework.routers import SimpleRouter

from training.api import views

WS = r"workspaces/(?P<ws>[a-z0-9-]+)"

router = SimpleRouter()
router.register(rf"{WS}/training-jobs", views.TrainingJobViewSet, basename="training-job")
router.register(
    rf"{WS}/training-templates", views.TrainingTemplateViewSet, basename="training-template"
)
router.register(rf"{WS}/tuning-jobs", views.TuningJobViewSet, basename="training-tuning-job")
router.register(rf"{WS}/entry-points", views.EntryPointViewSet, basename="training-entry-point")
router.register(rf"{WS}/pipelines", views.PipelineViewSet, basename="training-pipeline")
router.register(rf"{WS}/notebooks", views.NotebookServerViewSet, basename="training-notebook")
router.register(rf"{WS}/pipeline-runs", views.PipelineRunViewSet, basename="training-pipeline-run")

router.register(
    rf"{WS}/candidate-evaluations",
    views.CandidateEvaluationViewSet,
    basename="training-candidate-evaluation",
)

urlpatterns = router.urls
