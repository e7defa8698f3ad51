"""Browser routes of the feature registry, under /w/<ws>/features/."""

from django.urls import path

from features import views

urlpatterns = [
    path("w/<slug:ws>/features/", views.feature_group_list, name="features-list"),
    # A hyphen cannot start or appear in a group name, so this never shadows a group.
    path("w/<slug:ws>/features/new-group/", views.feature_group_create, name="features-new"),
    path("w/<slug:ws>/features/import-feast/", views.feast_import_page, name="features-feast"),
    path(
        "w/<slug:ws>/features/groups/<str:name>/",
        views.feature_group_page,
        name="features-group",
    ),
    path(
        "w/<slug:ws>/features/groups/<str:name>/schema/",
        views.feature_group_schema,
        name="features-group-schema",
    ),
    path(
        "w/<slug:ws>/features/groups/<str:name>/lifecycle/",
        views.feature_group_lifecycle,
        name="features-group-lifecycle",
    ),
    path(
        "w/<slug:ws>/features/groups/<str:name>/features/<str:feature>/lifecycle/",
        views.feature_lifecycle,
        name="features-feature-lifecycle",
    ),
    path(
        "w/<slug:ws>/features/groups/<str:name>/upload/",
        views.feature_group_upload,
        name="features-group-upload",
    ),
    path("w/<slug:ws>/features/datasets/", views.dataset_list, name="features-datasets"),
    path("w/<slug:ws>/features/datasets/new/", views.dataset_create, name="features-dataset-new"),
    path(
        "w/<slug:ws>/features/datasets/new/preview/",
        views.dataset_preview,
        name="features-dataset-preview",
    ),
    path(
        "w/<slug:ws>/features/datasets/<str:name>/v<int:version>/",
        views.dataset_page,
        name="features-dataset",
    ),
    path(
        "w/<slug:ws>/features/datasets/<str:name>/v<int:version>/progress/",
        views.dataset_progress,
        name="features-dataset-progress",
    ),
]
