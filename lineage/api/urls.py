"""REST routes of the lineage app, included under /api/v1/."""

urlpatterns: list = []
