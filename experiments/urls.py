"""Browser UI routes of the experiments app, under /w/<ws>/experiments/."""

from django.urls import path

from experiments import loop_views, views

urlpatterns = [
    path("w/<slug:ws>/loops/", loop_views.loop_list, name="experiments-loops"),
    path("w/<slug:ws>/loops/new/", loop_views.loop_new, name="experiments-loop-new"),
    path("w/<slug:ws>/loops/<int:pk>/", loop_views.loop_page, name="experiments-loop"),
    path("w/<slug:ws>/loops/<int:pk>/retry/", loop_views.loop_retry, name="experiments-loop-retry"),
    path("w/<slug:ws>/experiments/", views.experiment_list, name="experiments-list"),
    path("w/<slug:ws>/experiments/new/", views.experiment_new, name="experiments-new"),
    path("w/<slug:ws>/experiments/layers/", views.layer_list, name="experiments-layers"),
    path("w/<slug:ws>/experiments/layers/room/", views.layer_room, name="experiments-layer-room"),
    path("w/<slug:ws>/experiments/<str:key>/", views.experiment_page, name="experiments-detail"),
    path("w/<slug:ws>/experiments/<str:key>/edit/", views.experiment_edit, name="experiments-edit"),
    path(
        "w/<slug:ws>/experiments/<str:key>/<str:action>/",
        views.experiment_action,
        name="experiments-action",
    ),
]
