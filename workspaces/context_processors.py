"""Template context for the navigation: the workspaces the user can switch to."""

from __future__ import annotations

from django.http import HttpRequest

from workspaces.selectors import workspaces_visible_to


def workspace_navigation(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_workspaces": []}
    return {"nav_workspaces": workspaces_visible_to(user=user)}
