"""Dashboard sections that apps to the right of workspaces plug in.

The workspace dashboard shows one card per area (features, jobs, models, ...). Workspaces must not
import those apps, so each app registers a provider here from its ``AppConfig.ready()``; the
dashboard calls the providers it finds and shows "Nothing here yet." for the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AnonymousUser, User

from workspaces.models import Workspace

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DashboardSection:
    """What a provider returns: the template that fills its card and that template's context."""

    template: str
    context: dict[str, Any] = field(default_factory=dict)


SectionProvider = Callable[..., DashboardSection | None]

_providers: dict[str, SectionProvider] = {}


def register_section(key: str, provider: SectionProvider) -> None:
    """Fill the dashboard card ``key`` with ``provider(workspace=..., user=...)``.

    Registering the same key again replaces the provider (``ready()`` may run twice in tests).
    """
    _providers[key] = provider


def registered_keys() -> list[str]:
    return sorted(_providers)


def sections_for(
    *, workspace: Workspace, user: User | AnonymousUser
) -> dict[str, DashboardSection]:
    """The filled cards of one workspace's dashboard, by key.

    A provider that fails leaves its card empty instead of taking the whole dashboard down.
    """
    filled: dict[str, DashboardSection] = {}
    for key, provider in _providers.items():
        try:
            section = provider(workspace=workspace, user=user)
        except Exception:  # one broken card must not take the dashboard down
            logger.exception("dashboard section %r failed for workspace %s", key, workspace.slug)
            continue
        if section is not None:
            filled[key] = section
    return filled
