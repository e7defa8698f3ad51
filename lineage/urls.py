"""Browser UI routes of the lineage app."""

urlpatterns: list = []
