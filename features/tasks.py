"""Celery tasks of the features app: thin, idempotent, taking ids. Beat runs the health checks
every minute and the sweep of uncommitted offline files every hour (config/settings.py); a batch
the push could not write online is written by the ``features.online`` consumer of the event log
(``features.materialization``, driven by ``workspaces.tasks.outbox_drain``); dataset builds and
rebuilds asked for from a page or the API run here."""

from __future__ import annotations

import logging

from celery import shared_task
from django.core.cache import cache

from features import health, materialization, offline_store, samples
from features.models import FeatureGroup
from workspaces.task_slots import SLOT_RETRY_SECONDS, workspace_task_slot

logger = logging.getLogger(__name__)

HEALTH_LOCK_KEY = "features:health-check-all:running"
MATERIALIZE_LOCK_KEY = "features:materialize-online:running"
LOCK_SECONDS = 15 * 60


@shared_task(name="features.tasks.health_check_all", ignore_result=True)
def health_check_all() -> dict[str, int]:
    """Check every group's health; a run that finds the previous one still going skips itself
    (the group lock would keep notifications single anyway, this saves the work)."""
    if not cache.add(HEALTH_LOCK_KEY, "1", timeout=LOCK_SECONDS):
        return {"skipped": 1}
    try:
        return health.health_check_all()
    finally:
        cache.delete(HEALTH_LOCK_KEY)


@shared_task(name="features.tasks.sweep_uncommitted_files", ignore_result=True)
def sweep_uncommitted_files() -> int:
    """Remove offline files a crashed push left (its batch row never committed); readers already
    skip them."""
    removed = offline_store.sweep_uncommitted()
    if removed:
        logger.warning("removed %d offline files of uncommitted batches", len(removed))
    return len(removed)


@shared_task(name="features.tasks.health_check_group", ignore_result=True)
def health_check_group(group_id: int) -> str | None:
    """Check one group now (e.g. right after its SLA changed)."""
    group = FeatureGroup.objects.unscoped().filter(pk=group_id).select_related("workspace").first()
    if group is None:
        return None
    return health.group_health_check(group=group).status


@shared_task(name="features.tasks.materialize_online", ignore_result=True)
def materialize_online(group_ids: list[int] | None = None) -> dict[str, int]:
    """With ``group_ids``, rebuild those groups' current versions from the offline record
    whether or not anything is pending; without, sweep every batch that never reached the online
    store (by hand: the consumer of the log is what writes them as they come)."""
    if group_ids:
        groups = (
            FeatureGroup.objects.unscoped()
            .filter(pk__in=group_ids, online=True)
            .select_related("workspace")
        )
        done, deferred = [], []
        for group in groups:
            # A rebuild holds one of its workspace's task slots; at the limit it waits in the
            # queue, not in a worker slot.
            with workspace_task_slot(
                workspace_id=group.workspace_id, kind="features.materialize"
            ) as held:
                if held:
                    done.append(materialization.group_materialize(group=group))
                else:
                    deferred.append(group.pk)
        if deferred:
            materialize_online.apply_async(args=[deferred], countdown=SLOT_RETRY_SECONDS)
    else:
        if not cache.add(MATERIALIZE_LOCK_KEY, "1", timeout=LOCK_SECONDS):
            return {"skipped": 1}
        try:
            done = materialization.materialize_pending()
        finally:
            cache.delete(MATERIALIZE_LOCK_KEY)
    return {
        **({"deferred": len(deferred)} if group_ids and deferred else {}),
        "groups": len(done),
        "rows_written": sum(d.rows_written for d in done),
        "batches": sum(d.batches for d in done),
    }


@shared_task(
    name="features.tasks.dataset_build",
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def dataset_build_task(dataset_id: int) -> str | None:
    """Build one dataset that is still ``building`` (queued by ``samples.dataset_create`` with
    ``background``); a redelivery of a finished build does nothing."""
    dataset = samples.dataset_build(int(dataset_id))
    return dataset.status if dataset is not None else None
