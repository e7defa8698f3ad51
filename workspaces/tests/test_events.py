"""The event log is append-only and is written in the same transaction as the change."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import DatabaseError, connection, transaction

from workspaces import services
from workspaces.events import EventOutsideTransactionError, Ref, event_record
from workspaces.models import (
    Event,
    EventRef,
    ImmutableEventError,
    Membership,
    Role,
    WorkspaceQuota,
)
from workspaces.testing.factories import UserFactory, make_workspace


@pytest.fixture
def event(workspace):
    return Event.objects.for_workspace(workspace).get(verb="workspace.created")


def test_workspace_creation_records_its_event_with_refs_and_resources(workspace):
    event = Event.objects.for_workspace(workspace).get(verb="workspace.created")
    assert event.payload["slug"] == workspace.slug
    assert event.resources == {}  # no resources used (quota limits are not usage)
    refs = list(event.refs.values_list("role", "kind", "object_id"))
    assert refs == [("subject", "workspace", str(workspace.pk))]


def test_event_cannot_be_saved_again(event):
    event.verb = "workspace.forged"
    with pytest.raises(ImmutableEventError):
        event.save()
    assert Event.objects.unscoped().get(pk=event.pk).verb == "workspace.created"


def test_event_cannot_be_deleted_by_instance_or_queryset(event, workspace):
    with pytest.raises(ImmutableEventError):
        event.delete()
    with pytest.raises(ImmutableEventError):
        Event.objects.for_workspace(workspace).delete()
    with pytest.raises(ImmutableEventError):
        Event.objects.for_workspace(workspace).update(verb="x")
    with pytest.raises(ImmutableEventError):
        EventRef.objects.filter(event=event).delete()
    with pytest.raises(ImmutableEventError):
        EventRef.objects.filter(event=event).update(label="x")
    assert Event.objects.unscoped().filter(pk=event.pk).exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigger is PostgreSQL's")
def test_database_refuses_raw_updates_and_deletes(event):
    for statement in (
        "UPDATE workspaces_event SET verb = 'forged' WHERE id = %s",
        "DELETE FROM workspaces_event WHERE id = %s",
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(statement, [event.pk])
    assert Event.objects.unscoped().get(pk=event.pk).verb == "workspace.created"


def test_event_outside_a_transaction_is_refused(workspace, django_db_blocker):
    # pytest-django wraps each test in a transaction; autocommit mode is what a stray call sees.
    with connection.cursor():
        pass
    atomic_blocks = connection.atomic_blocks
    connection.atomic_blocks = []
    connection.in_atomic_block = False
    try:
        with pytest.raises(EventOutsideTransactionError):
            event_record(actor=None, workspace=workspace, verb="stray.event")
    finally:
        connection.atomic_blocks = atomic_blocks
        connection.in_atomic_block = True


def test_failing_write_rolls_back_its_event(workspace):
    """A service that fails after recording its event leaves neither the change nor the event."""
    user = UserFactory()
    before = Event.objects.for_workspace(workspace).count()

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        services.membership_grant(actor=None, workspace=workspace, user=user, role=Role.VIEWER)
        assert Event.objects.for_workspace(workspace).count() == before + 1
        raise Boom

    assert Event.objects.for_workspace(workspace).count() == before
    assert not Membership.objects.for_workspace(workspace).filter(user=user).exists()
    assert not user.has_perm("workspaces.view_workspace", workspace)
    # The same grant, committed, does leave all three: the checks above could fail.
    with transaction.atomic():
        services.membership_grant(actor=None, workspace=workspace, user=user, role=Role.VIEWER)
    assert Event.objects.for_workspace(workspace).count() == before + 1
    assert Membership.objects.for_workspace(workspace).filter(user=user).exists()
    assert type(user).objects.get(pk=user.pk).has_perm("workspaces.view_workspace", workspace)


def test_invalid_quota_change_writes_nothing(workspace):
    before = Event.objects.for_workspace(workspace).count()
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        services.quota_set(actor=None, workspace=workspace, gpu_milli=-1)
    with pytest.raises(ValidationError, match="all-types quota only"):
        services.quota_set(actor=None, workspace=workspace, gpu_type="A100", storage_gb=5)
    assert Event.objects.for_workspace(workspace).count() == before
    assert not WorkspaceQuota.objects.for_workspace(workspace).exists()


def test_duplicate_workspace_writes_nothing(workspace):
    from workspaces.exceptions import ConflictError

    total = Event.objects.unscoped().count()
    with pytest.raises(ConflictError, match=workspace.slug):
        make_workspace(slug=workspace.slug)
    assert Event.objects.unscoped().count() == total


def test_ref_to_uses_model_name_and_label(workspace):
    ref = Ref.to(workspace, role=EventRef.RefRole.OUTPUT)
    assert (ref.kind, ref.object_id, ref.label, ref.role) == (
        "workspace",
        workspace.pk,
        workspace.slug,
        "output",
    )
