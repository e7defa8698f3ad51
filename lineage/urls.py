"""Browser UI routes of the lineage app."""

from django.urls import path

from lineage import views

urlpatterns = [
    path("w/<slug:ws>/lineage/", views.graph_page, name="lineage-graph"),
    path("w/<slug:ws>/lineage/suggest/", views.suggest, name="lineage-suggest"),
]
