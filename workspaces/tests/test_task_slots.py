"""Per-workspace task slots: at most ``max_concurrent_tasks`` held at once per workspace, freed
on release or after their time to live; another workspace is never affected."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from workspaces.models import TaskSlot
from workspaces.services import workspace_policy_set
from workspaces.task_slots import task_slot_acquire, task_slot_release, workspace_task_slot

pytestmark = pytest.mark.django_db


def test_a_workspace_holds_at_most_its_limit_and_others_are_unaffected(workspace, other_workspace):
    workspace_policy_set(actor=None, workspace=workspace, max_concurrent_tasks=2)
    first = task_slot_acquire(workspace_id=workspace.pk, kind="k")
    second = task_slot_acquire(workspace_id=workspace.pk, kind="k")
    assert first is not None and second is not None and first.slot != second.slot
    assert task_slot_acquire(workspace_id=workspace.pk, kind="k") is None
    # The other workspace has its own slots (default limit 1).
    with workspace_task_slot(workspace_id=other_workspace.pk, kind="k") as held:
        assert held
        with workspace_task_slot(workspace_id=other_workspace.pk, kind="k") as again:
            assert not again
    task_slot_release(first)
    assert task_slot_acquire(workspace_id=workspace.pk, kind="k") is not None


def test_the_context_manager_releases_even_on_error(workspace):
    with pytest.raises(RuntimeError), workspace_task_slot(workspace_id=workspace.pk, kind="k"):
        raise RuntimeError("the task failed")
    assert not TaskSlot.objects.for_workspace(workspace).exists()


def test_a_slot_whose_holder_died_is_free_after_its_ttl(workspace):
    stale = task_slot_acquire(workspace_id=workspace.pk, kind="k")
    assert task_slot_acquire(workspace_id=workspace.pk, kind="k") is None
    TaskSlot.objects.for_workspace(workspace).filter(pk=stale.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    fresh = task_slot_acquire(workspace_id=workspace.pk, kind="k")
    assert fresh is not None
    task_slot_release(stale)  # the dead holder's late release leaves the new holder's slot
    assert TaskSlot.objects.for_workspace(workspace).filter(pk=fresh.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_rebuild_at_the_limit_is_deferred_to_the_queue_not_run():
    """The features rebuild task: while the workspace's only slot is held, it runs nothing and
    queues itself again (to a queue no worker reads here)."""
    from config.celery import app
    from features import tasks
    from features.tests.factories import make_group
    from workspaces.models import Event
    from workspaces.testing.factories import make_member, make_workspace

    workspace = make_workspace()
    group = make_group(workspace, actor=make_member(workspace), name="user_profile")
    queue = f"test-{uuid.uuid4().hex[:12]}"
    routes = app.conf.task_routes

    def route(table):
        app.conf.task_routes = table
        app.amqp.flush_routes()
        app.amqp.__dict__.pop("router", None)  # Celery caches the router built from them

    route({**(routes or {}), "features.tasks.materialize_online": {"queue": queue}})
    try:
        with workspace_task_slot(workspace_id=workspace.pk, kind="something heavy") as held:
            assert held
            result = tasks.materialize_online(group_ids=[group.pk])
        assert result["deferred"] == 1 and result["groups"] == 0
        assert (
            not Event.objects.for_workspace(workspace)
            .filter(verb="feature_group.materialized")
            .exists()
        )
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            try:
                assert channel.queue_declare(queue=queue, passive=True).message_count == 1
            finally:
                channel.queue_purge(queue)
        # With the slot free it runs.
        assert tasks.materialize_online(group_ids=[group.pk])["groups"] == 1
        assert not TaskSlot.objects.for_workspace(workspace).exists()
    finally:
        route(routes)


@pytest.mark.django_db(transaction=True)
def test_a_held_slot_is_renewed_while_its_block_runs_and_a_dead_holders_lapses(workspace):
    """The lease: a live holder's slot outlives its ttl (renewed from a thread), a holder that
    died (no renewals) frees it after the ttl, not after the 15 minutes it used to be."""
    import time

    ttl = 0.6
    with workspace_task_slot(workspace_id=workspace.pk, kind="k", ttl_s=ttl) as held:
        assert held
        first = TaskSlot.objects.for_workspace(workspace).get().expires_at
        deadline = time.monotonic() + 10
        while TaskSlot.objects.for_workspace(workspace).get().expires_at <= first:
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)
        assert task_slot_acquire(workspace_id=workspace.pk, kind="k") is None
    assert not TaskSlot.objects.for_workspace(workspace).exists()
    # A holder SIGKILLed mid-task renews nothing: its default lease lapses within 30 s.
    dead = task_slot_acquire(workspace_id=workspace.pk, kind="k")
    assert dead.expires_at <= timezone.now() + timedelta(seconds=30)
