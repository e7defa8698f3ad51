"""Template context for the navigation: the workspaces the user can switch to and the number
of unread notifications on the bell."""

from __future__ import annotations

from functools import cache

from django.http import HttpRequest

from workspaces.notifications import notifications_unread_count
from workspaces.selectors import workspaces_visible_to


def workspace_navigation(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_workspaces": [], "nav_unread": 0}

    @cache
    def unread() -> int:
        # Counted only when a page draws the bell (JSON and partial responses never do), once.
        return notifications_unread_count(user=user)

    return {"nav_workspaces": workspaces_visible_to(user=user), "nav_unread": unread}
