"""Panels that apps to the right of features add to a feature group's page.

The group page belongs to features, but some of what it should show is computed further right
(e.g. training's permutation importance per feature, F10). Features must not import those apps,
so each registers a panel here from its ``AppConfig.ready()``; the page renders every registered
panel in registration order. Same shape as ``workspaces.dashboard.register_section``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.http import HttpRequest
from django.utils.safestring import SafeString, mark_safe

from features.models import FeatureGroup
from workspaces.models import Workspace

logger = logging.getLogger(__name__)

# fn(request, workspace, group) -> rendered HTML, or None when the panel has nothing to show.
GroupPanel = Callable[[HttpRequest, Workspace, FeatureGroup], str | None]

_panels: dict[str, GroupPanel] = {}


@dataclass(frozen=True)
class RenderedPanel:
    name: str
    html: SafeString


def register_group_panel(name: str, fn: GroupPanel) -> None:
    """Add panel ``name`` to every feature group page.

    Registering the same name again replaces the panel (``ready()`` may run twice in tests).
    """
    _panels[name] = fn


def unregister_group_panel(name: str) -> None:
    """Drop a panel (tests; an app that turns a panel off)."""
    _panels.pop(name, None)


def registered_group_panels() -> list[str]:
    return list(_panels)


def group_panels(
    *, request: HttpRequest, workspace: Workspace, group: FeatureGroup
) -> list[RenderedPanel]:
    """The panels to show on ``group``'s page, skipping empty ones.

    A panel's HTML is trusted (it comes from the registering app's own template rendering). A
    panel that fails is logged and left out instead of taking the whole page down.
    """
    rendered: list[RenderedPanel] = []
    for name, fn in list(_panels.items()):
        try:
            html = fn(request, workspace, group)
        except Exception:  # one broken panel must not take the group page down
            logger.exception(
                "feature group panel %r failed for %s/%s", name, workspace.slug, group.name
            )
            continue
        if html:
            rendered.append(RenderedPanel(name=name, html=mark_safe(html)))  # noqa: S308
    return rendered
