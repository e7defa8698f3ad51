"""Drop the lineage projection and replay the whole event log into it."""

from django.core.management.base import BaseCommand

from lineage.projection import rebuild
from lineage.queries import graph_summary


class Command(BaseCommand):
    help = "Rebuild the lineage graph, cost usage and audit items from the event log."

    def handle(self, *args, **options) -> None:
        applied = rebuild()
        self.stdout.write(f"replayed {applied} events; {graph_summary()}")
