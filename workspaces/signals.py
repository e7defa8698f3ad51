"""Signal wiring: any write that can change who may do what invalidates the access caches."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models.signals import m2m_changed, post_delete, post_save

from workspaces import access_cache

# Saves that change nothing about who may do what (a login stamps ``last_login``): they must
# neither flush every process's access cache nor fail while the cache is down.
ACCESS_NEUTRAL_FIELDS = frozenset({"last_login", "last_used_at"})


def _invalidate(update_fields=None, **kwargs) -> None:
    if update_fields and set(update_fields) <= ACCESS_NEUTRAL_FIELDS:
        return
    access_cache.invalidate()


def connect_access_invalidation(*models) -> None:
    """Invalidate the access caches whenever a row of these models is saved or deleted."""
    for model in models:
        uid = f"access-cache-{model._meta.label}"
        post_save.connect(_invalidate, sender=model, dispatch_uid=f"{uid}-save", weak=False)
        post_delete.connect(_invalidate, sender=model, dispatch_uid=f"{uid}-delete", weak=False)


def connect() -> None:
    from guardian.models import GroupObjectPermission, UserObjectPermission

    from workspaces.models import ApiToken, Membership, ServiceAccount, Workspace

    User = get_user_model()
    connect_access_invalidation(
        User,
        Group,
        ApiToken,
        Membership,
        ServiceAccount,
        Workspace,
        UserObjectPermission,
        GroupObjectPermission,
    )
    for through in (
        ApiToken.workspaces.through,
        User.groups.through,
        User.user_permissions.through,
    ):
        m2m_changed.connect(
            _invalidate,
            sender=through,
            dispatch_uid=f"access-cache-m2m-{through._meta.label}",
            weak=False,
        )
