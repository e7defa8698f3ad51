"""REST routes of the training app, included under /api/v1/."""

urlpatterns: list = []
