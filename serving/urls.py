"""Browser UI routes of the serving app."""

urlpatterns: list = []
