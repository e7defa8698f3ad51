"""Writes for workspaces, memberships, quotas, service accounts and tokens.

Each function is one use case, runs in one transaction and records its event in it.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypedDict, Unpack

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User as AuthUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone
from guardian.shortcuts import assign_perm, remove_perm

from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError
from workspaces.models import (
    ROLE_PERMISSIONS,
    WORKSPACE_PERMISSIONS,
    ApiToken,
    Membership,
    QuotaRequest,
    Role,
    ServiceAccount,
    Workspace,
    WorkspacePolicy,
    WorkspaceQuota,
    default_workspace_template,
    hash_token_key,
)

User = get_user_model()


def _validate(instance: Any, *, exclude: list[str] | None = None) -> None:
    instance.full_clean(exclude=exclude)


@transaction.atomic
def workspace_create(
    *,
    actor: Actor,
    slug: str,
    name: str,
    scene: str,
    prediction_type: str,
    description: str = "",
    template: dict[str, Any] | None = None,
    quota: Mapping[str, int | None] | None = None,
) -> Workspace:
    """Create a workspace for a business scene, with its template and, when ``quota`` names
    limits (``cpu_milli``, ``memory_mb``, ``gpu_milli``, ``storage_gb``), its all-types quota.
    Without one the workspace is unlimited, as the scheduler treats a workspace without a quota."""
    if Workspace.objects.filter(slug=slug).exists():
        raise ConflictError(f"a workspace with slug '{slug}' already exists", attr="slug")
    if Workspace.objects.filter(scene=scene, prediction_type=prediction_type).exists():
        raise ConflictError(
            f"scene '{scene}' already has a '{prediction_type}' workspace", attr="prediction_type"
        )
    workspace = Workspace(
        slug=slug,
        name=name or slug,
        scene=scene,
        prediction_type=prediction_type,
        description=description,
        template=template if template is not None else default_workspace_template(),
        created_by=actor_user(actor),
    )
    _validate(workspace, exclude=["created_by"])
    workspace.save()
    limits = {name: value for name, value in (quota or {}).items() if value is not None}
    unknown = set(limits) - set(WorkspaceQuota.LIMITS)
    if unknown:
        raise ValidationError({sorted(unknown)[0]: "not a quota resource"})
    event_record(
        actor=actor,
        workspace=workspace,
        verb="workspace.created",
        refs=[Ref.to(workspace)],
        payload={
            "slug": slug,
            "scene": scene,
            "prediction_type": prediction_type,
            "template": workspace.template,
        },
    )
    if limits:
        # ``limits`` holds only WorkspaceQuota.LIMITS names (checked above), all int keywords.
        quota_set(actor=actor, workspace=workspace, **limits)  # type: ignore[arg-type]
    return workspace


@transaction.atomic
def workspace_update(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str | None = None,
    description: str | None = None,
    template: dict[str, Any] | None = None,
) -> Workspace:
    """Change a workspace's name, description or template (its default sample stream and model)."""
    changes = {
        field: value
        for field, value in (("name", name), ("description", description), ("template", template))
        if value is not None and value != getattr(workspace, field)
    }
    if "template" in changes and not isinstance(template, dict):
        raise ValidationError({"template": "must be a JSON object"})
    if not changes:
        return workspace
    before = {field: getattr(workspace, field) for field in changes}
    for field, value in changes.items():
        setattr(workspace, field, value)
    _validate(workspace, exclude=["created_by", "slug"])
    workspace.save(update_fields=list(changes))
    event_record(
        actor=actor,
        workspace=workspace,
        verb="workspace.changed",
        refs=[Ref.to(workspace)],
        payload={"before": before, "after": changes},
    )
    return workspace


def _assign_role_permissions(*, user: AuthUser, workspace: Workspace, role: str) -> None:
    granted = set(ROLE_PERMISSIONS[role])
    for codename in WORKSPACE_PERMISSIONS:
        if codename in granted:
            assign_perm(f"workspaces.{codename}", user, workspace)
        else:
            remove_perm(f"workspaces.{codename}", user, workspace)


def _refuse_removing_last_admin(*, workspace: Workspace, user: AuthUser) -> None:
    admins = (
        Membership.objects.for_workspace(workspace)
        .select_for_update()
        .filter(role=Role.ADMIN)
        .values_list("user_id", flat=True)
    )
    if list(admins) == [user.pk]:
        raise ConflictError(
            f"'{user.get_username()}' is the last admin of '{workspace.slug}'", attr="user"
        )


@transaction.atomic
def membership_grant(
    *, actor: Actor, workspace: Workspace, user: AuthUser, role: str
) -> Membership:
    """Give a user a role in a workspace (or change it), with guardian permissions to match."""
    if role not in Role.values:
        raise ValidationError({"role": f"'{role}' is not one of {', '.join(Role.values)}"})
    if not user.is_active:
        raise ValidationError({"user": f"user '{user.get_username()}' is inactive"})
    membership = (
        Membership.objects.select_for_update().filter(workspace=workspace, user=user).first()
    )
    previous_role = membership.role if membership else None
    if previous_role == Role.ADMIN and role != Role.ADMIN:
        _refuse_removing_last_admin(workspace=workspace, user=user)
    if membership is None:
        membership = Membership(
            workspace=workspace, user=user, role=role, granted_by=actor_user(actor)
        )
    else:
        membership.role = role
        membership.granted_by = actor_user(actor)
        membership.granted_at = timezone.now()
    try:
        with transaction.atomic():
            membership.save()
    except IntegrityError as exc:
        raise ConflictError(
            f"membership of '{user.get_username()}' changed concurrently; retry", attr="user"
        ) from exc
    _assign_role_permissions(user=user, workspace=workspace, role=role)
    event_record(
        actor=actor,
        workspace=workspace,
        verb="membership.granted" if previous_role is None else "membership.changed",
        refs=[Ref.to(workspace), Ref(kind="user", object_id=user.pk, label=user.get_username())],
        payload={"user": user.get_username(), "role": role, "previous_role": previous_role},
    )
    return membership


@transaction.atomic
def membership_revoke(*, actor: Actor, workspace: Workspace, user: AuthUser) -> None:
    """Remove a user from a workspace; the last admin of a workspace cannot be removed."""
    membership = (
        Membership.objects.select_for_update().filter(workspace=workspace, user=user).first()
    )
    if membership is None:
        raise ValidationError({"user": f"'{user.get_username()}' is not a member"})
    if membership.role == Role.ADMIN:
        _refuse_removing_last_admin(workspace=workspace, user=user)
    membership.delete()
    for codename in WORKSPACE_PERMISSIONS:
        remove_perm(f"workspaces.{codename}", user, workspace)
    event_record(
        actor=actor,
        workspace=workspace,
        verb="membership.revoked",
        refs=[Ref.to(workspace), Ref(kind="user", object_id=user.pk, label=user.get_username())],
        payload={"user": user.get_username(), "previous_role": membership.role},
    )


class ResourceLimits(TypedDict, total=False):
    """A quota's scheduler limits, as keywords of ``quota_set`` and ``quota_request_create``
    (``None`` or left out: unlimited)."""

    cpu_milli: int | None
    memory_mb: int | None
    gpu_milli: int | None


class QuotaLimits(ResourceLimits, total=False):
    storage_gb: int | None  # on the all-types quota only; enforced at feature pushes


@transaction.atomic
def quota_set(
    *, actor: Actor, workspace: Workspace, gpu_type: str = "", **limits: Unpack[QuotaLimits]
) -> WorkspaceQuota:
    """Create or change a workspace's quota for one GPU type (blank: all types); a limit left
    out or ``None`` is unlimited. Records ``quota.changed`` with the limits before and after
    (A2).

    Only platform admins (superusers) or the platform itself (``actor=None``) change quotas;
    workspace admins file a quota request instead."""
    if actor is not None and getattr(actor, "is_authenticated", False) and not actor.is_superuser:
        raise PermissionDenied("Quotas are changed by platform admins only.")
    storage_gb = limits.get("storage_gb")
    if gpu_type and storage_gb is not None:
        raise ValidationError({"storage_gb": "storage is limited on the all-types quota only"})
    existing: WorkspaceQuota | None = (
        WorkspaceQuota.objects.for_workspace(workspace)
        .select_for_update()
        .filter(gpu_type=gpu_type)
        .first()
    )
    created = existing is None
    quota = existing or WorkspaceQuota(workspace=workspace, gpu_type=gpu_type)
    before = None if existing is None else existing.limits()
    quota.cpu_milli, quota.memory_mb = limits.get("cpu_milli"), limits.get("memory_mb")
    quota.gpu_milli, quota.storage_gb = limits.get("gpu_milli"), storage_gb
    _validate(quota, exclude=["workspace"] if created else None)
    after = quota.limits()
    if before == after:
        return quota
    quota.save()
    event_record(
        actor=actor,
        workspace=workspace,
        verb="quota.changed",
        refs=[Ref("workspace_quota", quota.pk, gpu_type or "all GPU types")],
        # Limits, not use: kept out of ``resources``, which lineage prices as usage.
        payload={"gpu_type": gpu_type, "before": before, "after": after},
    )
    return quota


def _new_token_key() -> str:
    return ApiToken.KEY_PREFIX + secrets.token_urlsafe(32)


@transaction.atomic
def api_token_create(
    *,
    actor: Actor,
    user: AuthUser,
    name: str,
    workspaces: list[Workspace] | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Issue a token for a user; returns the row and the key, which is shown only this once."""
    if not name or len(name) > 100:
        raise ValidationError({"name": "give the token a name of 1-100 characters"})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "must be in the future"})
    key = _new_token_key()
    token = ApiToken.objects.create(
        user=user,
        name=name,
        key_hash=hash_token_key(key),
        prefix=key[:10],
        expires_at=expires_at,
    )
    scope = list(workspaces or [])
    if scope:
        token.workspaces.set(scope)
    targets: list[Workspace | None] = [*scope] or [None]
    for workspace in targets:
        event_record(
            actor=actor,
            workspace=workspace,
            verb="token.created",
            refs=[Ref(kind="api_token", object_id=token.pk, label=token.prefix)],
            payload={"owner": user.get_username(), "name": name, "prefix": token.prefix},
        )
    return token, key


@transaction.atomic
def api_token_revoke(*, actor: Actor, token: ApiToken) -> ApiToken:
    """Revoke a token at once; revoking twice is harmless."""
    token = ApiToken.objects.select_for_update().get(pk=token.pk)
    if token.revoked_at is not None:
        return token
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    scope: list[Workspace | None] = list(token.workspaces.all())
    for workspace in scope or [None]:
        event_record(
            actor=actor,
            workspace=workspace,
            verb="token.revoked",
            refs=[Ref(kind="api_token", object_id=token.pk, label=token.prefix)],
            payload={"owner": token.user.get_username(), "prefix": token.prefix},
        )
    return token


@transaction.atomic
def service_account_create(
    *,
    actor: Actor,
    workspace: Workspace,
    username: str,
    role: str = Role.DEVELOPER,
    description: str = "",
) -> tuple[ServiceAccount, str]:
    """Create a producer/automation account in one workspace and its first token.

    Returns the account and the token key (shown once). The account cannot log in with a
    password and cannot be given a role above maintainer.
    """
    if role not in (Role.VIEWER, Role.DEVELOPER, Role.MAINTAINER):
        raise ValidationError({"role": "a service account can be viewer, developer or maintainer"})
    if User.objects.filter(username=username).exists():
        raise ConflictError(f"username '{username}' is taken", attr="username")
    user = User(username=username)
    user.set_unusable_password()
    _validate(user, exclude=["password"])
    user.save()
    account = ServiceAccount.objects.create(
        user=user, workspace=workspace, description=description, created_by=actor_user(actor)
    )
    event_record(
        actor=actor,
        workspace=workspace,
        verb="service_account.created",
        refs=[Ref.to(workspace), Ref(kind="user", object_id=user.pk, label=username)],
        payload={"username": username, "role": role},
    )
    membership_grant(actor=actor, workspace=workspace, user=user, role=role)
    _token, key = api_token_create(
        actor=actor, user=user, name=f"{username} producer", workspaces=[workspace]
    )
    return account, key


POLICY_FIELDS = (
    "max_lineage_datasets",
    "max_batch_rows",
    "max_job_epochs",
    "max_job_steps",
    "max_job_wall_s",
    "max_concurrent_tasks",
)


@transaction.atomic
def workspace_policy_set(
    *, actor: Actor, workspace: Workspace, **limits: int | None
) -> WorkspacePolicy:
    """Change a workspace's fair-use limits (None: the platform default). Only platform admins
    call this (the admin console); every change is recorded."""
    unknown = set(limits) - set(POLICY_FIELDS)
    if unknown:
        raise ValidationError({sorted(unknown)[0]: "not a policy limit"})
    policy, created = WorkspacePolicy.objects.select_for_update().get_or_create(workspace=workspace)
    before = {name: getattr(policy, name) for name in POLICY_FIELDS}
    for name, value in limits.items():
        setattr(policy, name, value)
    _validate(policy, exclude=["workspace"])
    policy.save()
    after = {name: getattr(policy, name) for name in POLICY_FIELDS}
    event_record(
        actor=actor,
        workspace=workspace,
        verb="workspace.policy.changed",
        refs=[Ref.to(workspace)],
        payload={"before": None if created else before, "after": after},
    )
    return policy


@transaction.atomic
def quota_request_create(
    *,
    actor: Actor,
    workspace: Workspace,
    gpu_type: str = "",
    reason: str = "",
    **limits: Unpack[ResourceLimits],
) -> QuotaRequest:
    """A workspace admin asks the platform admins for a different scheduler quota (recorded;
    nothing changes until a platform admin approves it)."""
    cpu_milli, memory_mb = limits.get("cpu_milli"), limits.get("memory_mb")
    gpu_milli = limits.get("gpu_milli")
    request = QuotaRequest(
        workspace=workspace,
        gpu_type=gpu_type,
        cpu_milli=cpu_milli,
        memory_mb=memory_mb,
        gpu_milli=gpu_milli,
        reason=reason,
        requested_by=actor_user(actor),
    )
    _validate(request, exclude=["workspace", "requested_by", "decided_by"])
    request.save()
    event_record(
        actor=actor,
        workspace=workspace,
        verb="quota_request.created",
        refs=[Ref("quota_request", request.pk, gpu_type or "all GPU types")],
        payload={
            "gpu_type": gpu_type,
            "cpu_milli": cpu_milli,
            "memory_mb": memory_mb,
            "gpu_milli": gpu_milli,
            "reason": reason[:2000],
        },
    )
    return request


def outbox_drain_soon() -> None:
    """Queue a drain of the event log's consumers unless one is queued already
    (``workspaces.tasks.enqueue_drain_once``)."""
    from workspaces.tasks import enqueue_drain_once

    enqueue_drain_once()
