"""Reads for workspaces, always narrowed to what the caller may see.

A workspace the caller cannot see is reported exactly like one that does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Model, QuerySet
from django.http import Http404
from guardian.core import ObjectPermissionChecker
from guardian.shortcuts import get_objects_for_user
from rest_framework import exceptions, status

from workspaces import access_cache
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import (
    POLICY_DEFAULTS,
    ROLE_PERMISSIONS,
    WORKSPACE_PERMISSIONS,
    ApiToken,
    Event,
    Membership,
    Role,
    Workspace,
    WorkspacePolicy,
)

# Whoever a request runs as: a user, or the anonymous user before sign-in.
Principal = User | AnonymousUser


def signed_in(user: Principal) -> User:
    """The signed-in user a request runs as. Views behind ``login_required`` or
    ``IsAuthenticated`` never see the anonymous user; should one get here, it is refused."""
    if isinstance(user, AnonymousUser):
        raise PermissionDenied("Sign in first.")
    return user


def workspaces_visible_to(*, user: Principal, token: ApiToken | None = None) -> QuerySet[Workspace]:
    """The workspaces a user (and, when given, the token they act by) may see."""
    if isinstance(user, AnonymousUser) or not user.is_authenticated or not user.is_active:
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


def workspace_access(
    *, user: Principal, slug: str, token: ApiToken | None = None
) -> tuple[Workspace, frozenset[str]]:
    """One workspace by slug with the caller's guardian permissions on it.

    Raises Http404 when it is missing, outside the token's scope, or not viewable by the caller.
    Every workspace-scoped request starts here, so the answer is cached per process and
    invalidated by any change to users, tokens, memberships or permissions (access_cache).
    """
    if isinstance(user, AnonymousUser) or not user.is_authenticated or not user.is_active:
        raise Http404("No such workspace.")
    if token is not None:
        scope = getattr(token, "scope_ids", None)
        if scope is None:
            scope = frozenset(token.workspaces.values_list("pk", flat=True))
    else:
        scope = frozenset()
    found = access_cache.cached(
        ("workspace-access", user.pk, slug, scope), lambda: _load_access(user, slug, scope)
    )
    if found is None:
        raise Http404("No such workspace.")
    workspace, perms = found
    return access_cache.private_copy(workspace), perms


def _load_access(
    user: User, slug: str, scope: frozenset[int]
) -> tuple[Workspace, frozenset[str]] | None:
    workspace = Workspace.objects.filter(slug=slug).first()
    if workspace is None or (scope and workspace.pk not in scope):
        return None
    if user.is_superuser:
        perms = frozenset(WORKSPACE_PERMISSIONS)
    else:
        perms = frozenset(ObjectPermissionChecker(user).get_perms(workspace))
    if "view_workspace" not in perms:
        return None
    return workspace, perms


def workspace_get_visible(
    *, user: Principal, slug: str, token: ApiToken | None = None
) -> Workspace:
    """One workspace by slug, or Http404 when it is missing or invisible to the caller."""
    return workspace_access(user=user, slug=slug, token=token)[0]


def role_from_perms(perms: frozenset[str]) -> str | None:
    """The strongest role whose permissions the caller holds on a workspace."""
    for role in reversed(Role.values):
        if set(ROLE_PERMISSIONS[role]) <= perms:
            return role
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
    if isinstance(user, AnonymousUser):
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user).prefetch_related("workspaces")


@dataclass(frozen=True)
class Policy:
    """The limits one workspace's requests, events and jobs are held to (see POLICY_DEFAULTS)."""

    max_lineage_datasets: int
    max_batch_rows: int
    max_job_epochs: int
    max_job_steps: int
    max_job_wall_s: int
    max_concurrent_tasks: int


def policy_defaults() -> dict[str, int]:
    """Platform-wide defaults: POLICY_DEFAULTS, with settings.WORKSPACE_POLICY_DEFAULTS on top."""
    return {**POLICY_DEFAULTS, **getattr(settings, "WORKSPACE_POLICY_DEFAULTS", {})}


def workspace_policy(workspace: Workspace | int | None) -> Policy:
    """The workspace's policy: its own values where a platform admin set them, else defaults
    (only the defaults for None: an object not yet saved in a workspace)."""
    values = policy_defaults()
    row = None if workspace is None else WorkspacePolicy.objects.for_workspace(workspace).first()
    if row is not None:
        for name in values:
            own = getattr(row, name)
            if own is not None:
                values[name] = int(own)
    return Policy(**{name: int(values[name]) for name in Policy.__dataclass_fields__})


class PolicyLimitExceeded(exceptions.APIException):
    """A request asks for more than the workspace's policy allows (413 in the error envelope)."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"

    def __init__(self, *, attr: str, limit_name: str, asked: int, limit: int) -> None:
        self.attr, self.limit_name, self.asked, self.limit = attr, limit_name, asked, limit
        super().__init__(
            f"{attr}: {asked} is more than this workspace allows ({limit_name} = {limit}).",
            "too_large",
        )


def policy_check(
    *, workspace: Workspace | int | None, limit_name: str, attr: str, asked: int
) -> None:
    """Raise PolicyLimitExceeded when ``asked`` is over the workspace's ``limit_name``."""
    limit = getattr(workspace_policy(workspace), limit_name)
    if asked > limit:
        raise PolicyLimitExceeded(attr=attr, limit_name=limit_name, asked=asked, limit=limit)


def workspace_object(
    model_or_queryset: type[Model] | QuerySet,
    *,
    workspace: Workspace | int,
    ref: Any,
    attr: str,
    name_field: str | None = "name",
    noun: str | None = None,
    invalid: str | None = None,
) -> Any:
    """The one resolver of a reference to a workspace's object: the object itself, its primary
    key (an int) or, when the model has one, its name (``name_field``; a str).

    Every service and view that accepts "a deployment, its id or its name" answers alike through
    here: a missing object and another workspace's one are the same ``ReferenceNotFound`` naming
    ``attr`` (404 in the API), and a reference of the wrong type is a ``ValidationError`` naming
    ``attr`` (400; ``invalid`` is its message). Pass a queryset to add ``select_related`` or
    narrow further; it is scoped to ``workspace`` here either way.
    """
    queryset = (
        model_or_queryset
        if isinstance(model_or_queryset, QuerySet)
        else model_or_queryset._default_manager.all()
    )
    model = queryset.model
    noun = noun or str(model._meta.verbose_name)
    workspace_id = workspace if isinstance(workspace, int) else workspace.pk
    if isinstance(ref, model):
        if ref.workspace_id != workspace_id:
            label = getattr(ref, name_field, ref.pk) if name_field else ref.pk
            raise ReferenceNotFound(f"no {noun} '{label}'", attr=attr)
        return ref
    queryset = queryset.for_workspace(workspace_id)  # type: ignore[union-attr]  # scoped managers
    if isinstance(ref, int) and not isinstance(ref, bool):
        found = queryset.filter(pk=ref).first()
        missing = f"no {noun} {ref}"
    elif isinstance(ref, str) and ref and name_field:
        found = queryset.filter(**{name_field: ref}).first()
        missing = f"no {noun} '{ref}'"
    else:
        wanted = f"a {noun} id or name" if name_field else f"a {noun} id"
        raise ValidationError({attr: invalid or f"give {wanted}"})
    if found is None:
        raise ReferenceNotFound(missing, attr=attr)
    return found
