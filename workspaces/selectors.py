"""Reads for workspaces, always narrowed to what the caller may see.

A workspace the caller cannot see is reported exactly like one that does not exist.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet
from django.http import Http404
from guardian.shortcuts import get_objects_for_user

from workspaces.models import ApiToken, Event, Membership, Role, Workspace

Principal = AbstractBaseUser | AnonymousUser


def workspaces_visible_to(*, user: Principal, token: ApiToken | None = None) -> QuerySet[Workspace]:
    """The workspaces a user (and, when given, the token they act by) may see."""
    if not user.is_authenticated or not user.is_active:
        return Workspace.objects.none()
    visible = get_objects_for_user(
        user, "workspaces.view_workspace", klass=Workspace, accept_global_perms=False
    )
    if user.is_superuser:
        visible = Workspace.objects.all()
    if token is not None:
        scoped_ids = list(token.workspaces.values_list("pk", flat=True))
        if scoped_ids:
            visible = visible.filter(pk__in=scoped_ids)
    return visible.order_by("slug")


def workspace_get_visible(
    *, user: Principal, slug: str, token: ApiToken | None = None
) -> Workspace:
    """One workspace by slug, or Http404 when it is missing or invisible to the caller."""
    workspace = workspaces_visible_to(user=user, token=token).filter(slug=slug).first()
    if workspace is None:
        raise Http404("No such workspace.")
    return workspace


def role_in_workspace(*, user: Principal, workspace: Workspace) -> str | None:
    """The user's role in the workspace; platform superusers act as its admin."""
    if not user.is_authenticated or not user.is_active:
        return None
    membership = Membership.objects.for_workspace(workspace).filter(user=user).first()
    if membership is not None:
        return membership.role
    if user.is_superuser:
        return Role.ADMIN
    return None


def role_at_least(role: str | None, required: str) -> bool:
    return role is not None and Role.rank(role) >= Role.rank(required)


def members_of(*, workspace: Workspace) -> QuerySet[Membership]:
    return (
        Membership.objects.for_workspace(workspace)
        .select_related("user", "user__service_account", "granted_by")
        .order_by("user__username")
    )


def events_of(*, workspace: Workspace) -> QuerySet[Event]:
    return (
        Event.objects.for_workspace(workspace)
        .prefetch_related("refs")
        .order_by("-created_at", "-id")
    )


def tokens_of(*, user: Principal) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).prefetch_related("workspaces")
