"""Token authentication: ``Authorization: Token <key>`` (or ``Bearer``), keys stored as hashes."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions

from workspaces import access_cache
from workspaces.models import ApiToken, hash_token_key

# Writing last_used_at on every request would turn every read into a write; once a minute is enough.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def _load_token(key_hash: str) -> ApiToken | None:
    token = ApiToken.objects.select_related("user").filter(key_hash=key_hash).first()
    if token is not None:
        # The scope travels with the cached token: no query per request to narrow it.
        # the scope rides on the cached token; workspace_access reads it with getattr.
        token.scope_ids = frozenset(token.workspaces.values_list("pk", flat=True))  # type: ignore[attr-defined]
    return token


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """Authenticates a request by API token; ``request.auth`` is the ApiToken row."""

    keywords = ("token", "bearer")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower().decode(errors="replace") not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Token <key>'.")
        try:
            key = header[1].decode()
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("Token contains invalid characters.") from exc
        key_hash = hash_token_key(key)
        shared = access_cache.cached(("token", key_hash), lambda: _load_token(key_hash))
        if shared is None or not shared.is_active:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        if not shared.user.is_active:
            raise exceptions.AuthenticationFailed("The token's user is inactive.")
        now = timezone.now()
        if shared.last_used_at is None or now - shared.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=shared.pk).update(last_used_at=now)
            shared.last_used_at = now
        token = access_cache.private_copy(shared)
        token.user = access_cache.private_copy(shared.user)
        return token.user, token

    def authenticate_header(self, request) -> str:
        return 'Token realm="api"'
