"""Browser routes of data building, under /w/<ws>/data/."""

from django.urls import path

from curation import views

urlpatterns = [
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
