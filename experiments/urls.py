"""Browser UI routes of the experiments app."""

urlpatterns: list = []
