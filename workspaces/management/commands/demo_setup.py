"""Populate the embedded `make run` platform with a demo admin, users and two workspaces.

Only in demo mode (DJANGO_ENV development/demo): demo credentials never exist in production.
Running it again changes nothing that is already there.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from workspaces import services
from workspaces.models import PredictionType, Role, ServiceAccount, Workspace
from workspaces.quota import limits_from_units

User = get_user_model()

DEMO_ADMIN = ("admin", "admin")
DEMO_USERS = [("alice", "alice-demo"), ("bob", "bob-demo")]
DEMO_WORKSPACES: list[dict[str, Any]] = [
    {
        "slug": "feed-pctr",
        "name": "Feed pCTR",
        "scene": "feed",
        "prediction_type": PredictionType.PCTR,
        "description": "Click-through prediction for ads in the home feed.",
        "quota": {"cpu_cores": 16, "memory_gb": 64, "gpus": 2, "storage_gb": 200},
        "members": {"alice": Role.DEVELOPER, "bob": Role.VIEWER},
    },
    {
        "slug": "search-pcvr",
        "name": "Search pCVR",
        "scene": "search",
        "prediction_type": PredictionType.PCVR,
        "description": "Conversion prediction for sponsored search results.",
        "quota": {"cpu_cores": 8, "memory_gb": 32, "gpus": 1, "storage_gb": 100},
        "members": {"bob": Role.MAINTAINER},
    },
]


class Command(BaseCommand):
    help = "Create the demo admin, demo users and two demo workspaces (demo mode only)."

    def handle(self, *args, **options) -> None:
        if not settings.DEMO_MODE:
            raise CommandError("demo_setup only runs in demo mode; never in production.")
        with transaction.atomic():
            admin = self._user(*DEMO_ADMIN, superuser=True)
            for username, password in DEMO_USERS:
                self._user(username, password)
            for spec in DEMO_WORKSPACES:
                workspace = Workspace.objects.filter(slug=spec["slug"]).first()
                if workspace is None:
                    workspace = services.workspace_create(
                        actor=admin,
                        slug=spec["slug"],
                        name=spec["name"],
                        scene=spec["scene"],
                        prediction_type=spec["prediction_type"],
                        description=spec["description"],
                        quota=limits_from_units(**spec["quota"]),
                    )
                    services.membership_grant(
                        actor=admin, workspace=workspace, user=admin, role=Role.ADMIN
                    )
                    for username, role in spec["members"].items():
                        services.membership_grant(
                            actor=admin,
                            workspace=workspace,
                            user=User.objects.get(username=username),
                            role=role,
                        )
            feed = Workspace.objects.get(slug="feed-pctr")
            producer_key = None
            if (
                not ServiceAccount.objects.for_workspace(feed)
                .filter(user__username="feed-producer")
                .exists()
            ):
                _account, producer_key = services.service_account_create(
                    actor=admin,
                    workspace=feed,
                    username="feed-producer",
                    description="Demo upstream feature producer.",
                )
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo login: {DEMO_ADMIN[0]} / {DEMO_ADMIN[1]} (platform admin); "
                + ", ".join(f"{u} / {p}" for u, p in DEMO_USERS)
            )
        )
        if producer_key:
            self.stdout.write(f"Demo producer token for feed-pctr: {producer_key}")

    def _user(self, username: str, password: str, *, superuser: bool = False):
        user = User.objects.filter(username=username).first()
        if user is None:
            user = User(username=username, email=f"{username}@example.com")
            user.is_staff = user.is_superuser = superuser
            user.set_password(password)
            user.save()
        return user
