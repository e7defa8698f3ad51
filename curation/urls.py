"""Browser routes of data building, under /w/<ws>/data/."""

from django.urls import path

from curation import annotation_views, views

urlpatterns = [
    path("w/<slug:ws>/data/tasks/", annotation_views.task_list, name="curation-tasks"),
    path("w/<slug:ws>/data/tasks/<str:name>/", annotation_views.task_page, name="curation-task"),
    path(
        "w/<slug:ws>/data/tasks/<str:name>/label/",
        annotation_views.label_page,
        name="curation-task-label",
    ),
    path(
        "w/<slug:ws>/data/tasks/<str:name>/review/",
        annotation_views.review_page,
        name="curation-task-review",
    ),
    path("w/<slug:ws>/data/", views.record_set_list, name="curation-record-sets"),
    path(
        "w/<slug:ws>/data/<str:name>/v<int:version>/",
        views.record_set_page,
        name="curation-record-set",
    ),
    path(
        "w/<slug:ws>/data/<str:name>/v<int:version>/progress/",
        views.record_set_progress,
        name="curation-record-set-progress",
    ),
]
