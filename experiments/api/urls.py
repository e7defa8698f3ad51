"""REST routes of the experiments app, included under /api/v1/."""

urlpatterns: list = []
