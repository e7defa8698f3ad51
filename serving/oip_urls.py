"""Open Inference Protocol routes (/v2/...), served at the site root."""

urlpatterns: list = []
