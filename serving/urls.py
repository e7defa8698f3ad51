"""Browser UI routes of the serving app, and the Prometheus ``/metrics`` endpoint."""

from django.urls import path

from serving import benchmark_views, quality_views, views
from serving.review_views import (
    review_close,
    review_create,
    review_judge,
    review_list,
    review_page,
    review_progress,
)

urlpatterns: list = [
    path("metrics", views.metrics, name="metrics"),
    path("w/<slug:ws>/models/", views.model_list, name="serving-models"),
    path("w/<slug:ws>/models/register/", views.version_register, name="serving-version-register"),
    path("w/<slug:ws>/models/import/", views.version_import, name="serving-version-import"),
    path(
        "w/<slug:ws>/models/<str:name>/compare/",
        views.version_compare,
        name="serving-compare",
    ),
    path(
        "w/<slug:ws>/models/<str:name>/v<int:version>/",
        views.version_detail,
        name="serving-version",
    ),
    path(
        "w/<slug:ws>/models/<str:name>/v<int:version>/deploy/",
        views.version_deploy,
        name="serving-version-deploy",
    ),
    path(
        "w/<slug:ws>/models/<str:name>/v<int:version>/try/",
        views.version_try,
        name="serving-version-try",
    ),
    path(
        "w/<slug:ws>/models/<str:name>/v<int:version>/quantize/",
        views.version_quantize,
        name="serving-version-quantize",
    ),
    path(
        "w/<slug:ws>/models/<str:name>/v<int:version>/gates/",
        views.version_gates,
        name="serving-version-gates",
    ),
    path(
        "w/<slug:ws>/models/<str:name>/v<int:version>/quality-override/",
        quality_views.version_quality_override,
        name="serving-version-quality-override",
    ),
    path("w/<slug:ws>/benchmarks/", benchmark_views.benchmark_list, name="serving-benchmarks"),
    path(
        "w/<slug:ws>/benchmarks/new/",
        benchmark_views.benchmark_create,
        name="serving-benchmark-create",
    ),
    path(
        "w/<slug:ws>/benchmarks/<str:name>/",
        benchmark_views.benchmark_detail,
        name="serving-benchmark",
    ),
    # Blind side-by-side human reviews (serving.review_views).
    path("w/<slug:ws>/reviews/", review_list, name="serving-reviews"),
    path("w/<slug:ws>/reviews/new/", review_create, name="serving-review-create"),
    path("w/<slug:ws>/reviews/<int:pk>/", review_page, name="serving-review"),
    path("w/<slug:ws>/reviews/<int:pk>/progress/", review_progress, name="serving-review-progress"),
    path("w/<slug:ws>/reviews/<int:pk>/close/", review_close, name="serving-review-close"),
    path("w/<slug:ws>/reviews/<int:pk>/judge/", review_judge, name="serving-review-judge"),
    path("w/<slug:ws>/deployments/", views.deployment_list, name="serving-deployments"),
    path("w/<slug:ws>/deployments/<str:name>/", views.deployment_detail, name="serving-deployment"),
    path(
        "w/<slug:ws>/deployments/<str:name>/status/",
        views.deployment_status_fragment,
        name="serving-deployment-status",
    ),
]
