"""REST routes of the serving app, included under /api/v1/."""

urlpatterns: list = []
