"""Every model admin over workspace-owned rows reads platform-wide through the one
``UnscopedAdminMixin``, and its change list answers for a superuser with rows of two
workspaces in it (a scoped queryset would raise instead); every add page an admin offers
renders (a choice list over workspace-owned rows, unscoped, would raise)."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.test import RequestFactory
from django.urls import reverse

from workspaces.admin_base import UnscopedAdminMixin
from workspaces.events import Ref, event_record
from workspaces.models import Event
from workspaces.testing.factories import UserFactory, make_workspace


def _workspace_owned_admins():
    return sorted(
        (
            (model, model_admin)
            for model, model_admin in admin.site._registry.items()
            if hasattr(model._default_manager, "unscoped")
        ),
        key=lambda pair: pair[0]._meta.label,
    )


def test_every_admin_of_workspace_owned_rows_uses_the_one_mixin():
    admins = _workspace_owned_admins()
    assert len(admins) >= 10
    without = [
        model._meta.label
        for model, model_admin in admins
        if not isinstance(model_admin, UnscopedAdminMixin)
    ]
    assert without == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "label", [model._meta.label_lower for model, _ in _workspace_owned_admins()]
)
def test_each_change_list_shows_every_workspace(client, label):
    first, second = make_workspace(), make_workspace()
    for workspace in (first, second):
        event_record(
            actor=None, workspace=workspace, verb="test.admin_listed", refs=[Ref.to(workspace)]
        )
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    app_label, model_name = label.split(".")
    response = client.get(reverse(f"admin:{app_label}_{model_name}_changelist"))
    assert response.status_code == 200
    if label == "workspaces.event":
        listed = {event.workspace_id for event in response.context["cl"].result_list}
        assert {first.pk, second.pk} <= listed
        assert response.context["cl"].result_count == Event.objects.unscoped().count()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "label",
    sorted(model._meta.label_lower for model in admin.site._registry),
)
def test_every_add_page_the_admin_offers_renders(client, label):
    """An admin that lets a superuser add rows renders its form; one whose rows only services
    write offers no add page (403) instead of failing on its choice lists."""
    make_workspace()
    user = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(user)
    app_label, model_name = label.split(".")
    request = RequestFactory().get("/")
    request.user = user
    offers = admin.site._registry[apps.get_model(label)].has_add_permission(request)
    response = client.get(reverse(f"admin:{app_label}_{model_name}_add"))
    assert response.status_code == (200 if offers else 403), response.content[-2000:]
