"""Browser routes of the scheduler: /w/<ws>/queue/ and the staff cluster view."""

from django.urls import path

from training.scheduler import views

urlpatterns = [
    path("w/<slug:ws>/queue/", views.queue_page, name="scheduler-queue"),
    path(
        "w/<slug:ws>/queue/recommendation/",
        views.recommendation_partial,
        name="scheduler-recommendation",
    ),
    path("scheduler/cluster/", views.cluster_page, name="scheduler-cluster"),
]
