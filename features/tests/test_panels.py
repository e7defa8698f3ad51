"""The feature group page's plugin hook: apps to the right add panels without features importing
them (``features.panels.register_group_panel``)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from features import panels
from features.tests.factories import make_group


@pytest.fixture
def registry():
    """An empty panel registry for the test, the installed apps' panels restored afterwards."""
    saved = dict(panels._panels)
    panels._panels.clear()
    yield panels
    panels._panels.clear()
    panels._panels.update(saved)


def page(workspace, user, name: str) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(reverse("features-group", kwargs={"ws": workspace.slug, "name": name}))
    assert response.status_code == 200
    return response.content.decode()


def test_registered_panels_render_on_the_group_page_in_order(workspace, members, registry):
    group = make_group(workspace, name="users")
    seen = []

    def first(request, ws, grp):
        seen.append((request.user, ws, grp))
        return f'<section data-testid="first">{escape(grp.name)} in {escape(ws.slug)}</section>'

    registry.register_group_panel("tests.first", first)
    registry.register_group_panel("tests.second", lambda r, w, g: "<p>second panel</p>")
    html = page(workspace, members["viewer"], "users")
    assert f'<section data-testid="first">users in {workspace.slug}</section>' in html
    assert html.index('data-panel="tests.first"') < html.index('data-panel="tests.second"')
    assert "<p>second panel</p>" in html  # the panel's own HTML, not escaped
    assert seen == [(members["viewer"], workspace, group)]


def test_no_registered_panel_means_no_panel(workspace, members, registry):
    make_group(workspace, name="users")
    assert registry.registered_group_panels() == []
    html = page(workspace, members["viewer"], "users")
    assert "data-panel=" not in html
    assert 'data-testid="schema"' in html  # the rest of the page is unchanged


def test_unregistered_panel_disappears(workspace, members, registry):
    make_group(workspace, name="users")
    registry.register_group_panel("tests.gone", lambda r, w, g: "<p>here</p>")
    assert "<p>here</p>" in page(workspace, members["viewer"], "users")
    registry.unregister_group_panel("tests.gone")
    assert "<p>here</p>" not in page(workspace, members["viewer"], "users")


def test_registering_a_name_again_replaces_the_panel(workspace, members, registry):
    make_group(workspace, name="users")
    registry.register_group_panel("tests.p", lambda r, w, g: "<p>old</p>")
    registry.register_group_panel("tests.p", lambda r, w, g: "<p>new</p>")
    html = page(workspace, members["viewer"], "users")
    assert "<p>new</p>" in html
    assert "<p>old</p>" not in html
    assert html.count('data-panel="tests.p"') == 1


def test_empty_and_broken_panels_are_left_out(workspace, members, registry, caplog):
    make_group(workspace, name="users")

    def broken(request, ws, grp):
        raise RuntimeError("boom")

    registry.register_group_panel("tests.none", lambda r, w, g: None)
    registry.register_group_panel("tests.broken", broken)
    registry.register_group_panel("tests.ok", lambda r, w, g: "<p>still here</p>")
    html = page(workspace, members["viewer"], "users")
    assert 'data-panel="tests.none"' not in html
    assert 'data-panel="tests.broken"' not in html
    assert "<p>still here</p>" in html
    assert "tests.broken" in caplog.text
