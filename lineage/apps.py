from django.apps import AppConfig


class LineageConfig(AppConfig):
    name = "lineage"
    verbose_name = "Lineage"

    def ready(self) -> None:
        from django.db.models.signals import post_save

        from lineage.projection import schedule_after_commit
        from workspaces.models import Event

        # Project each committed event soon after its transaction commits.
        post_save.connect(schedule_after_commit, sender=Event, dispatch_uid="lineage-project")

        from lineage.openlineage import CONSUMER, EXPORTED_VERBS, openlineage_export
        from workspaces import outbox

        # OpenLineage export is a consumer of the event log with a cursor of its own.
        outbox.consumer_register(CONSUMER, openlineage_export, verbs=EXPORTED_VERBS)

        from lineage.views import dashboard_section
        from workspaces.dashboard import register_section

        register_section("lineage", dashboard_section)

        from workspaces.demo import register_demo_step

        register_demo_step(50, "lineage", _demo_lineage)


def _demo_lineage(base_url: str, stdout) -> None:
    """Project everything the earlier demo steps recorded, so the graph is there to look at."""
    from lineage.projection import project
    from lineage.queries import graph_summary

    applied = project(gap_wait=0)
    stdout.write(f"lineage: projected {applied} events; {graph_summary()}\n")
