"""Browser UI routes of the training app."""

urlpatterns: list = []
