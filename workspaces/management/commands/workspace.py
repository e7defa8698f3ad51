"""Scripted workspace setup for admins.

manage.py workspace create SLUG --scene S --prediction-type P [--name N] [--gpus 4 ...]
manage.py workspace grant SLUG USERNAME ROLE
manage.py workspace revoke SLUG USERNAME
manage.py workspace quota SLUG [--cpu-cores N] [--memory-gb N] [--gpus N] [--storage-gb N]
manage.py workspace list
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from workspaces import services
from workspaces.exceptions import ConflictError
from workspaces.models import PredictionType, Role, Workspace, WorkspaceQuota
from workspaces.quota import limits_from_units

User = get_user_model()


UNITS = ("cpu_cores", "memory_gb", "gpus", "storage_gb")


def _add_quota_options(parser) -> None:
    for resource in UNITS:
        parser.add_argument(f"--{resource.replace('_', '-')}", dest=resource, type=float)


class Command(BaseCommand):
    help = "Create workspaces, grant roles and set quotas (admin setup from scripts)."

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a workspace for a business scene")
        create.add_argument("slug")
        create.add_argument("--scene", required=True)
        create.add_argument("--prediction-type", required=True, choices=PredictionType.values)
        create.add_argument("--name", default="")
        create.add_argument("--description", default="")
        _add_quota_options(create)
        grant = sub.add_parser("grant", help="give a user a role in a workspace")
        grant.add_argument("slug")
        grant.add_argument("username")
        grant.add_argument("role", choices=Role.values)
        revoke = sub.add_parser("revoke", help="remove a user from a workspace")
        revoke.add_argument("slug")
        revoke.add_argument("username")
        quota = sub.add_parser("quota", help="set a workspace's resource limits")
        quota.add_argument("slug")
        _add_quota_options(quota)
        sub.add_parser("list", help="list workspaces")

    def handle(self, *args, action: str, **options) -> None:
        try:
            getattr(self, f"handle_{action}")(**options)
        except (ValidationError, ConflictError) as exc:
            raise CommandError("; ".join(getattr(exc, "messages", [str(exc)]))) from exc

    def _workspace(self, slug: str) -> Workspace:
        workspace = Workspace.objects.filter(slug=slug).first()
        if workspace is None:
            raise CommandError(f"no workspace '{slug}'")
        return workspace

    def _user(self, username: str):
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user '{username}'")
        return user

    @staticmethod
    def _limits(options) -> dict[str, int]:
        """The options given, in the quota's units (cores -> milli-CPU, GiB -> MiB, ...)."""
        given = {name: options.get(name) for name in UNITS}
        return {k: v for k, v in limits_from_units(**given).items() if v is not None}

    def handle_create(self, *, slug, scene, prediction_type, name, description, **options) -> None:
        workspace = services.workspace_create(
            actor=None,
            slug=slug,
            name=name or slug,
            scene=scene,
            prediction_type=prediction_type,
            description=description,
            quota=self._limits(options),
        )
        self.stdout.write(self.style.SUCCESS(f"created workspace {workspace}"))

    def handle_grant(self, *, slug, username, role, **options) -> None:
        membership = services.membership_grant(
            actor=None, workspace=self._workspace(slug), user=self._user(username), role=role
        )
        self.stdout.write(self.style.SUCCESS(str(membership)))

    def handle_revoke(self, *, slug, username, **options) -> None:
        services.membership_revoke(
            actor=None, workspace=self._workspace(slug), user=self._user(username)
        )
        self.stdout.write(self.style.SUCCESS(f"removed {username} from {slug}"))

    def handle_quota(self, *, slug, **options) -> None:
        limits = self._limits(options)
        if not limits:
            raise CommandError(
                "name at least one of --cpu-cores, --memory-gb, --gpus, --storage-gb"
            )
        workspace = self._workspace(slug)
        current = WorkspaceQuota.objects.for_workspace(workspace).filter(gpu_type="").first()
        merged = {**(current.limits() if current else {}), **limits}  # the others stay as set
        quota = services.quota_set(actor=None, workspace=workspace, **merged)
        self.stdout.write(self.style.SUCCESS(f"quota of {slug}: {quota.limits()}"))

    def handle_list(self, **options) -> None:
        for workspace in Workspace.objects.all():
            self.stdout.write(f"{workspace.slug}\t{workspace.scene}\t{workspace.prediction_type}")
