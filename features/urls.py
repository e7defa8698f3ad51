"""Browser routes of the feature registry, under /w/<ws>/features/."""

from django.urls import path

from features import views

urlpatterns = [
    path("w/<slug:ws>/features/", views.feature_group_list, name="features-list"),
    path(
        "w/<slug:ws>/features/groups/<str:name>/",
        views.feature_group_page,
        name="features-group",
    ),
    path("w/<slug:ws>/features/datasets/", views.dataset_list, name="features-datasets"),
    path(
        "w/<slug:ws>/features/datasets/<str:name>/v<int:version>/",
        views.dataset_page,
        name="features-dataset",
    ),
]
