"""Run every app's demo step in order against the running platform (demo mode only)."""

from __future__ import annotations

import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workspaces.demo import demo_steps


class Command(BaseCommand):
    help = "Populate the running demo platform: every app's registered demo step, in order."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--base-url", default="http://127.0.0.1:8000")
        parser.add_argument("--only", action="append", default=[], help="Run only these steps.")

    def handle(self, *args, **options) -> None:
        if not settings.DEMO_MODE:
            raise CommandError("demo_run only runs in demo mode; never in production.")
        for step in demo_steps():
            if options["only"] and step.name not in options["only"]:
                continue
            started = time.monotonic()
            self.stdout.write(f"demo step {step.order} {step.name}: starting")
            step.run(options["base_url"], self.stdout)
            self.stdout.write(f"demo step {step.name}: done in {time.monotonic() - started:.1f} s")
