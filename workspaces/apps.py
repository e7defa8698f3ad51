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

        from django.db.backends.signals import connection_created

        from workspaces import db_reconnect

        connection_created.connect(db_reconnect.install, dispatch_uid="db-reconnect")

        from django.db.models.signals import post_save

        from workspaces import notifications, outbox
        from workspaces.models import Event

        # Every side effect is a consumer of the event log; this one delivers notifications.
        outbox.consumer_register(
            notifications.CONSUMER,
            notifications.notifications_consume,
            verbs=[notifications.NOTIFICATION_VERB],
        )
        post_save.connect(outbox.schedule_after_commit, sender=Event, dispatch_uid="outbox-drain")
