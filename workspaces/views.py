"""Browser UI: the workspace shell (dashboard, members, activity) and the user's API tokens;
``workspace_page`` and ``page_context`` are what every app's pages are built on."""

from __future__ import annotations

from functools import wraps
from typing import cast

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from workspaces import notifications, services
from workspaces.dashboard import sections_for
from workspaces.exceptions import ConflictError
from workspaces.forms import MemberGrantForm, MemberRoleForm, TokenCreateForm
from workspaces.models import Role, Workspace
from workspaces.selectors import (
    events_of,
    members_of,
    role_at_least,
    role_from_perms,
    signed_in,
    tokens_of,
    workspace_access,
    workspaces_visible_to,
)

DASHBOARD_SECTIONS = [
    ("features", "Features", "Feature groups, producers and their health."),
    ("jobs", "Training jobs", "Jobs, pipelines and their progress."),
    ("models", "Models", "Registered model versions and deployments."),
    ("experiments", "Experiments", "A/B experiments and their results."),
    ("lineage", "Lineage", "From feature to experiment, with cost."),
    ("quota", "Quota", "What the scheduler admits this workspace's jobs within."),
]


class WorkspaceRequest(HttpRequest):
    """The request a ``workspace_page`` view receives: the workspace it resolved to and the
    caller's role there ride on it (the page shell reads both)."""

    workspace: Workspace
    workspace_role: str | None


def workspace_page(required_role: str = Role.VIEWER):
    """Resolve ``ws`` to a workspace the user can see (404 otherwise) holding ``required_role``."""

    def decorator(view):
        @login_required
        @wraps(view)
        def wrapper(request: HttpRequest, ws: str, *args, **kwargs) -> HttpResponse:
            workspace, perms = workspace_access(user=request.user, slug=ws)
            role = role_from_perms(perms)
            if not role_at_least(role, required_role):
                raise PermissionDenied(f"This needs the {required_role} role.")
            scoped = cast(WorkspaceRequest, request)
            scoped.workspace = workspace
            scoped.workspace_role = role
            return view(scoped, workspace, *args, **kwargs)

        return wrapper

    return decorator


def page_context(request: WorkspaceRequest, **extra) -> dict:
    """The template context every workspace page starts from (the shell reads these keys); the
    apps' pages call it from views wrapped in ``workspace_page``."""
    return {
        "workspace": request.workspace,
        "role": request.workspace_role,
        "is_workspace_admin": role_at_least(request.workspace_role, Role.ADMIN),
        **extra,
    }


@login_required
def home(request: HttpRequest) -> HttpResponse:
    first = workspaces_visible_to(user=request.user).first()
    if first is not None:
        return redirect("workspace-dashboard", ws=first.slug)
    return render(request, "workspaces/no_workspace.html")


@workspace_page()
def dashboard(request: WorkspaceRequest, workspace) -> HttpResponse:
    recent = list(events_of(workspace=workspace)[:10])
    filled = sections_for(workspace=workspace, user=request.user)
    return render(
        request,
        "workspaces/dashboard.html",
        page_context(
            request,
            sections=[
                (key, label, blurb, filled.get(key)) for key, label, blurb in DASHBOARD_SECTIONS
            ],
            recent_events=recent,
            member_count=members_of(workspace=workspace).count(),
            section="dashboard",
        ),
    )


@workspace_page()
def members(request: WorkspaceRequest, workspace) -> HttpResponse:
    return render(
        request,
        "workspaces/members.html",
        page_context(
            request,
            memberships=members_of(workspace=workspace),
            grant_form=MemberGrantForm(),
            roles=Role.choices,
            section="members",
        ),
    )


def _report(request: HttpRequest, exc: Exception) -> None:
    if isinstance(exc, ValidationError):
        for message in exc.messages:
            messages.error(request, message)
    else:
        messages.error(request, str(exc))


@require_POST
@workspace_page(Role.ADMIN)
def member_grant(request: WorkspaceRequest, workspace) -> HttpResponse:
    form = MemberGrantForm(request.POST)
    if form.is_valid():
        try:
            services.membership_grant(
                actor=request.user,
                workspace=workspace,
                user=form.cleaned_data["username"],
                role=form.cleaned_data["role"],
            )
            messages.success(
                request, f"{form.cleaned_data['username']} is now {form.cleaned_data['role']}."
            )
        except (ValidationError, ConflictError) as exc:
            _report(request, exc)
    else:
        for errors in form.errors.values():
            for error in errors:
                messages.error(request, str(error))
    return redirect("workspace-members", ws=workspace.slug)


@require_POST
@workspace_page(Role.ADMIN)
def member_change(request: WorkspaceRequest, workspace, username: str) -> HttpResponse:
    membership = get_object_or_404(members_of(workspace=workspace), user__username=username)
    form = MemberRoleForm(request.POST)
    if form.is_valid():
        try:
            services.membership_grant(
                actor=request.user,
                workspace=workspace,
                user=membership.user,
                role=form.cleaned_data["role"],
            )
            messages.success(request, f"{username} is now {form.cleaned_data['role']}.")
        except (ValidationError, ConflictError) as exc:
            _report(request, exc)
    return redirect("workspace-members", ws=workspace.slug)


@require_POST
@workspace_page(Role.ADMIN)
def member_remove(request: WorkspaceRequest, workspace, username: str) -> HttpResponse:
    membership = get_object_or_404(members_of(workspace=workspace), user__username=username)
    try:
        services.membership_revoke(actor=request.user, workspace=workspace, user=membership.user)
        messages.success(request, f"{username} was removed.")
    except (ValidationError, ConflictError) as exc:
        _report(request, exc)
    return redirect("workspace-members", ws=workspace.slug)


@workspace_page()
def activity(request: WorkspaceRequest, workspace) -> HttpResponse:
    events = events_of(workspace=workspace)
    verb = request.GET.get("verb", "").strip()
    if verb:
        events = events.filter(verb__startswith=verb)
    page = Paginator(events, 50).get_page(request.GET.get("page"))
    return render(
        request,
        "workspaces/activity.html",
        page_context(request, page=page, verb=verb, section="activity"),
    )


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    visible = list(workspaces_visible_to(user=request.user))
    choices = [(w.slug, w.slug) for w in visible]
    new_key = None
    if request.method == "POST":
        form = TokenCreateForm(request.POST, workspace_choices=choices)
        if form.is_valid():
            scope = [w for w in visible if w.slug in form.cleaned_data["workspaces"]]
            _token, new_key = services.api_token_create(
                actor=request.user,
                user=signed_in(request.user),
                name=form.cleaned_data["name"],
                workspaces=scope,
            )
            form = TokenCreateForm(workspace_choices=choices)
    else:
        form = TokenCreateForm(workspace_choices=choices)
    return render(
        request,
        "workspaces/tokens.html",
        {"tokens": tokens_of(user=request.user), "form": form, "new_key": new_key},
    )


@require_POST
@login_required
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(tokens_of(user=request.user), pk=token_id)
    services.api_token_revoke(actor=request.user, token=token)
    messages.success(request, f"Token {token.prefix}… was revoked.")
    return redirect("tokens")


INBOX_PAGE_SIZE = 50


def _internal_link(link: str) -> str:
    """A notification's link if it is a path on this site, else nothing to click (the link is
    stored text: ``javascript:``, ``//elsewhere`` and ``/\\elsewhere`` are not followed)."""
    if link.startswith("/") and url_has_allowed_host_and_scheme(link, allowed_hosts=None):
        return link
    return ""


@login_required
def inbox(request: HttpRequest) -> HttpResponse:
    """The user's notifications from all their workspaces, newest first."""
    page = Paginator(
        notifications.notifications_of(user=signed_in(request.user)), INBOX_PAGE_SIZE
    ).get_page(request.GET.get("page"))
    items = [(n, _internal_link(n.link)) for n in page.object_list]
    return render(
        request,
        "workspaces/inbox.html",
        {
            "page": page,
            "items": items,
            "section": "inbox",
        },
    )


@require_POST
@login_required
def inbox_mark_read(request: HttpRequest, notification_id: int) -> HttpResponse:
    notification = get_object_or_404(
        notifications.notifications_of(user=signed_in(request.user)), pk=notification_id
    )
    notifications.notification_mark_read(user=signed_in(request.user), notification=notification)
    return redirect("inbox")


@require_POST
@login_required
def inbox_mark_all_read(request: HttpRequest) -> HttpResponse:
    count = notifications.notifications_mark_all_read(user=signed_in(request.user))
    messages.success(request, f"{count} notification{'s' if count != 1 else ''} marked read.")
    return redirect("inbox")
