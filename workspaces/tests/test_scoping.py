"""Fail-closed tenant scoping: a workspace-owned queryset must be narrowed before it runs."""

from __future__ import annotations

import pytest
from django.db import models
from django.test.utils import isolate_apps

from workspaces.checks import unscoped_workspace_models
from workspaces.models import Event, Membership, Role, Workspace
from workspaces.scoping import UnscopedQueryError, WorkspaceScopedQuerySet


def test_unscoped_queryset_refuses_to_run(workspace):
    for attempt in (
        lambda: list(Event.objects.all()),
        lambda: Event.objects.count(),
        lambda: Event.objects.exists(),
        lambda: Event.objects.first(),
        lambda: list(Event.objects.filter(verb="workspace.created")),
        lambda: list(Event.objects.exclude(workspace=workspace)),
        lambda: list(Membership.objects.iterator()),
    ):
        with pytest.raises(UnscopedQueryError):
            attempt()


def test_scoped_queryset_returns_only_that_workspace(workspace, other_workspace):
    rows = list(Event.objects.for_workspace(workspace))
    assert rows
    assert {row.workspace_id for row in rows} == {workspace.pk}
    # Narrowing survives chaining and filtering by the workspace counts as narrowing.
    assert Event.objects.for_workspace(workspace).filter(verb__startswith="workspace").count() == 1
    assert Event.objects.filter(workspace=other_workspace).count() == 1
    assert list(workspace.events.all()) == rows


def test_lookups_that_do_not_pin_a_workspace_do_not_count_as_narrowing(workspace, members):
    for attempt in (
        lambda: list(Event.objects.filter(workspace__isnull=False)),
        lambda: Event.objects.filter(workspace_id__gt=0).count(),
        lambda: Event.objects.filter(workspace__slug__startswith="").exists(),
        lambda: list(Event.objects.filter(workspace=None)),
        lambda: list(Membership.objects.filter(workspace__name__icontains="")),
    ):
        with pytest.raises(UnscopedQueryError):
            attempt()
    # Equality on the workspace, its id, pk or slug, and __in, do.
    assert Membership.objects.filter(workspace__slug=workspace.slug).count() == len(Role.values)
    # workspace.created and one membership.granted per member
    assert Event.objects.filter(workspace_id__in=[workspace.pk]).count() == 1 + len(Role.values)


def test_update_and_delete_need_a_workspace_too(workspace, members):
    with pytest.raises(UnscopedQueryError, match="update"):
        Membership.objects.filter(role="viewer").update(role="admin")
    with pytest.raises(UnscopedQueryError, match="delete"):
        Membership.objects.filter(role="viewer").delete()
    assert Membership.objects.for_workspace(workspace).filter(role="viewer").count() == 1
    scoped = Membership.objects.for_workspace(workspace).filter(role="viewer")
    assert scoped.update(role="viewer") == 1
    # bulk_update works on loaded (and so already scoped) rows.
    rows = list(Membership.objects.for_workspace(workspace).filter(role="viewer"))
    assert Membership.objects.bulk_update(rows, ["role"]) == 1


def test_unscoped_is_an_explicit_choice(workspace, other_workspace):
    assert Event.objects.unscoped().filter(verb="workspace.created").count() == 2


@isolate_apps("workspaces")
def test_system_check_flags_a_workspace_model_without_scoped_manager():
    class Leaky(models.Model):
        workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)

        class Meta:
            app_label = "workspaces"

    class Tight(models.Model):
        workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE)
        objects = WorkspaceScopedQuerySet.as_manager()

        class Meta:
            app_label = "workspaces"

    problems = unscoped_workspace_models([Leaky, Tight])
    assert [(p.id, p.obj) for p in problems] == [("workspaces.E001", Leaky)]
