from django.apps import AppConfig


class FeaturesConfig(AppConfig):
    name = "features"
    verbose_name = "Features"

    def ready(self) -> None:
        from features.views import dashboard_section
        from workspaces.dashboard import register_section

        register_section("features", dashboard_section)
