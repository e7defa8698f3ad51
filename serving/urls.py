"""Browser UI routes of the serving app, and the Prometheus ``/metrics`` endpoint."""

from django.urls import path

from serving import quality_views, views

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
        "w/<slug:ws>/models/<str:name>/v<int:version>/gates/",
        views.version_gates,
        name="serving-version-gates",
    ),
    path(
        "w/<slug:ws>/models/<str:name>/v<int:version>/quality-override/",
        quality_views.version_quality_override,
        name="serving-version-quality-override",
    ),
    path("w/<slug:ws>/deployments/", views.deployment_list, name="serving-deployments"),
    path("w/<slug:ws>/deployments/<str:name>/", views.deployment_detail, name="serving-deployment"),
    path(
        "w/<slug:ws>/deployments/<str:name>/status/",
        views.deployment_status_fragment,
        name="serving-deployment-status",
    ),
]
