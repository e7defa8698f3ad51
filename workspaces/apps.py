from django.apps import AppConfig


class WorkspacesConfig(AppConfig):
    name = "workspaces"
    verbose_name = "Workspaces and audit"

    def ready(self) -> None:
        from workspaces import (
            checks,  # noqa: F401 - registers the system checks
            signals,
        )
        from workspaces.api import schema  # noqa: F401 - registers the OpenAPI auth extension

        signals.connect()
