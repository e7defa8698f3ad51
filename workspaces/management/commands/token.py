"""Issue and revoke API tokens from scripts.

manage.py token create USERNAME [--name N] [--workspace SLUG ...] [--days N]   (prints the key)
manage.py token revoke PREFIX
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from workspaces import services
from workspaces.models import ApiToken, Workspace
from workspaces.selectors import workspaces_visible_to

User = get_user_model()


class Command(BaseCommand):
    help = "Create (prints the key once) or revoke API tokens."

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="issue a token for a user; prints the key")
        create.add_argument("username")
        create.add_argument("--name", default="cli")
        create.add_argument(
            "--workspace", action="append", default=[], help="limit the token to this workspace"
        )
        create.add_argument("--days", type=int, help="expire after this many days")
        revoke = sub.add_parser("revoke", help="revoke a token by its prefix")
        revoke.add_argument("prefix")

    def handle(self, *args, action: str, **options) -> None:
        if action == "create":
            self._create(**options)
        else:
            self._revoke(options["prefix"])

    def _create(self, *, username, name, workspace, days, **options) -> None:
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user '{username}'")
        scope = []
        if workspace:
            visible = workspaces_visible_to(user=user)
            for slug in workspace:
                found = visible.filter(slug=slug).first()
                if found is None:
                    exists = Workspace.objects.filter(slug=slug).exists()
                    reason = f"{username} is not a member of it" if exists else "no such workspace"
                    raise CommandError(f"cannot limit the token to '{slug}': {reason}")
                scope.append(found)
        expires_at = timezone.now() + timedelta(days=days) if days else None
        _token, key = services.api_token_create(
            actor=None, user=user, name=name, workspaces=scope, expires_at=expires_at
        )
        self.stdout.write(key)

    def _revoke(self, prefix: str) -> None:
        tokens = list(ApiToken.objects.filter(prefix=prefix))
        if len(tokens) != 1:
            raise CommandError(f"{len(tokens)} tokens match prefix '{prefix}'; expected one")
        services.api_token_revoke(actor=None, token=tokens[0])
        self.stdout.write(self.style.SUCCESS(f"revoked {prefix}"))
