from django.apps import AppConfig


class FeaturesConfig(AppConfig):
    name = "features"
    verbose_name = "Features"
