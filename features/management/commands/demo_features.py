"""Push the demo ads log into the feed-pctr workspace over the REST API, as its producer would.

Run by ``make run`` in the background once the web server answers. It registers the demo feature
groups if they are missing and pushes every batch with an Idempotency-Key, so running it again
stores nothing twice. Demo mode only; needs ``demo_setup`` (the workspace and its producer).
"""

from __future__ import annotations

import importlib.util
import time
import urllib.error
import urllib.request
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from features.demo import DemoProducer, DemoPushError, simulate_arrival_times
from workspaces import services
from workspaces.models import ServiceAccount, Workspace

WORKSPACE = "feed-pctr"
PRODUCER = "feed-producer"


class Command(BaseCommand):
    help = "Register the demo feature groups and push the demo ads log over the REST API."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--base-url", default="http://127.0.0.1:8000")
        parser.add_argument(
            "--scale", type=float, default=1.0, help="Size of the log; 1.0 is ~20k impressions."
        )
        parser.add_argument(
            "--wait", type=float, default=60.0, help="Seconds to wait for /healthz."
        )

    def handle(self, *args, **options) -> None:
        if not settings.DEMO_MODE:
            raise CommandError("demo_features only runs in demo mode; never in production.")
        base_url: str = options["base_url"].rstrip("/")
        if not base_url.startswith(("http://", "https://")):
            raise CommandError("--base-url must be an http(s) URL")
        scale: float = options["scale"]
        if not 0 < scale <= 10:
            raise CommandError("--scale must be above 0 and at most 10")
        workspace = Workspace.objects.filter(slug=WORKSPACE).first()
        account = (
            ServiceAccount.objects.for_workspace(workspace)
            .filter(user__username=PRODUCER)
            .select_related("user")
            .first()
            if workspace is not None
            else None
        )
        if account is None:
            raise CommandError(f"No {WORKSPACE} workspace with {PRODUCER}: run demo_setup first.")

        started = time.monotonic()
        self._wait_for(base_url, options["wait"])
        token, key = services.api_token_create(
            actor=None,
            user=account.user,
            name="demo_features",
            workspaces=[workspace],
            expires_at=timezone.now() + timedelta(hours=1),
        )
        producer = DemoProducer(
            base_url=base_url,
            token=key,
            workspace=WORKSPACE,
            producer=PRODUCER,
            log=self.stdout.write,
        )
        try:
            report = producer.push(
                anchor=timezone.now().replace(minute=0, second=0, microsecond=0), scale=scale
            )
        except DemoPushError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            services.api_token_revoke(actor=None, token=token)
        simulate_arrival_times(workspace=workspace, anchor=report.anchor, scale=scale)

        if importlib.util.find_spec("features.health") is not None:
            from features.health import health_check_all

            health_check_all()
            self.stdout.write("health checked every feature group")
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo features in {WORKSPACE}: {len(report.registered)} groups registered, "
                f"{report.stored} batches stored ({report.rows} rows), {report.replayed} "
                f"replayed, {report.conflicts} already stored; anchored at "
                f"{report.anchor:%Y-%m-%d %H:%M} UTC; {time.monotonic() - started:.1f} s."
            )
        )

    def _wait_for(self, base_url: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                with urllib.request.urlopen(f"{base_url}/healthz", timeout=2) as answer:  # noqa: S310
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() >= deadline:
                raise CommandError(f"{base_url}/healthz did not answer within {seconds:g} s")
            time.sleep(0.5)
