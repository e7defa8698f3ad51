"""The base for every workspace-scoped API view.

It resolves ``{ws}`` from the URL against what the caller may see (404 otherwise, exactly like a
missing workspace), checks the caller's role through django-guardian object permissions, and
insists that the view's queryset is narrowed to that workspace. Anything a view does not declare
is denied: unsafe actions need an entry in ``action_roles``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.models import QuerySet
from rest_framework import exceptions, permissions, viewsets
from rest_framework.request import Request

from workspaces.models import ApiToken, Role, Workspace
from workspaces.scoping import WorkspaceScopedQuerySet
from workspaces.selectors import workspace_access

# The guardian object permission on the workspace that stands for each role.
ROLE_PERMISSION = {
    Role.VIEWER: "view_workspace",
    Role.DEVELOPER: "develop_in_workspace",
    Role.MAINTAINER: "release_in_workspace",
    Role.ADMIN: "administer_workspace",
}


def request_token(request: Request) -> ApiToken | None:
    return request.auth if isinstance(request.auth, ApiToken) else None


class WorkspaceRolePermission(permissions.BasePermission):
    """Allow the action when the caller holds the role the view asks for it in the workspace."""

    def has_permission(self, request: Request, view: Any) -> bool:
        required = view.required_role(request)
        if required is None:
            return False
        return ROLE_PERMISSION[required] in view.workspace_perms


class WorkspaceScopedViewSet(viewsets.GenericViewSet):
    """Base viewset for resources nested under ``/api/v1/workspaces/{ws}/``."""

    workspace_url_kwarg = "ws"
    permission_classes = [permissions.IsAuthenticated, WorkspaceRolePermission]
    # Safe methods need this role; unsafe actions must be listed in action_roles.
    read_role: str = Role.VIEWER
    action_roles: dict[str, str] = {}

    workspace: Workspace
    workspace_perms: frozenset[str]

    def required_role(self, request: Request) -> str | None:
        if self.action in self.action_roles:
            return self.action_roles[self.action]
        if request.method in permissions.SAFE_METHODS:
            return self.read_role
        return None

    def check_permissions(self, request: Request) -> None:
        if not request.user or not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        self.workspace, self.workspace_perms = workspace_access(
            user=request.user,
            slug=self.kwargs.get(self.workspace_url_kwarg, ""),
            token=request_token(request),
        )
        super().check_permissions(request)

    def get_workspace_queryset(self) -> QuerySet:
        raise ImproperlyConfigured(f"{type(self).__name__} must define get_workspace_queryset()")

    def get_queryset(self) -> QuerySet:
        if getattr(self, "swagger_fake_view", False):
            return self.queryset.none() if self.queryset is not None else QuerySet().none()
        queryset = self.get_workspace_queryset()
        if isinstance(queryset, WorkspaceScopedQuerySet) and not queryset._is_scoped():
            raise ImproperlyConfigured(
                f"{type(self).__name__}.get_workspace_queryset() is not narrowed to the workspace"
            )
        return queryset

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        context["workspace"] = getattr(self, "workspace", None)
        return context
