"""Apply the events recorded since the last projection (what the Celery task does)."""

from django.core.management.base import BaseCommand

from lineage.projection import project


class Command(BaseCommand):
    help = "Project new events into the lineage graph."

    def handle(self, *args, **options) -> None:
        self.stdout.write(f"applied {project(gap_wait=0)} events")
