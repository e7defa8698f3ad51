"""Materialisation: write a group's online rows from its offline (Parquet) record.

An accepted batch is durable offline first; the push writes it online right after commit, and
that write may fail (Redis down, a worker lost), leaving ``Batch.online_written`` false. The
``features.online`` consumer of the event log (``workspaces.outbox``) reads every committed
``feature_batch.ingested`` event after its cursor and writes that batch online when the push did
not (``batch_materialize_event``); a handler that fails (the online store is down) keeps the
cursor before the event, so it is tried again until it succeeds. The online store keeps a row
only when it is not older than the stored one, so writing a batch twice (the push and the
consumer racing) is harmless and the consumer idempotent. ``group_materialize`` rebuilds a whole
group version on demand.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
from django.db import transaction
from django.utils import timezone

from features import offline_store
from features.ingestion import write_online
from features.models import Batch, FeatureGroup, FeatureGroupVersion, Lifecycle
from workspaces.events import Ref, event_record
from workspaces.models import Event

CONSUMER = "features.online"
# A rebuild reads and writes the latest rows of this many entities at a time: its memory stays
# bounded however many entities the group has.
MATERIALIZE_BATCH_ROWS = 50_000


@dataclass(frozen=True)
class Materialized:
    """What one rebuild did: entities read offline, online rows replaced, batches marked."""

    group_id: int
    version: int
    entities: int
    rows_written: int
    batches: int


def group_materialize(
    *, group: FeatureGroup, version: int | None = None, now: datetime | None = None
) -> Materialized:
    """Replay the latest offline row per entity of one group version into the online store, in
    bounded batches (``MATERIALIZE_BATCH_ROWS``), then mark the batches that were waiting for it
    as written and stamp the group; the event reports the rows per second."""
    now = now or timezone.now()
    version = version or group.current_version
    batches = Batch.objects.for_workspace(group.workspace_id).filter(group=group, version=version)
    # Taken before reading: a batch that lands during the rebuild stays pending for the next run.
    pending = list(batches.filter(online_written=False).values_list("pk", flat=True))
    spec = (
        FeatureGroupVersion.objects.for_workspace(group.workspace_id)
        .filter(group=group, version=version)
        .get()
    )
    started = time.monotonic()
    entities = written = 0
    for chunk in offline_store.latest_per_entity(
        workspace_id=group.workspace_id,
        group_id=group.pk,
        version=version,
        entity_keys=group.entity_keys,
        time_column=group.event_time_column,
        columns=[s["name"] for s in spec.features],
        batch_rows=MATERIALIZE_BATCH_ROWS,
    ):
        if chunk.num_rows:
            entities += chunk.num_rows
            written += write_online(
                group=group, version=version, table=pa.Table.from_batches([chunk]), spec=spec
            )
    seconds = time.monotonic() - started
    with transaction.atomic():
        marked = batches.filter(pk__in=pending, online_written=False).update(online_written=True)
        FeatureGroup.objects.filter(pk=group.pk, workspace=group.workspace_id).update(
            online_materialized_at=now
        )
        if marked or not pending:
            event_record(
                actor=None,
                workspace=group.workspace,
                verb="feature_group.materialized",
                refs=[Ref.to(group, role="output")],
                resources={"rows": written},
                payload={
                    "name": group.name,
                    "version": version,
                    "entities": entities,
                    "rows_written": written,
                    "batches": marked,
                    "seconds": round(seconds, 3),
                    "rows_per_s": round(entities / seconds, 1) if seconds > 0 else None,
                },
            )
    group.online_materialized_at = now
    return Materialized(
        group_id=group.pk, version=version, entities=entities, rows_written=written, batches=marked
    )


def materialize_pending(now: datetime | None = None) -> list[Materialized]:
    """Rebuild every (online group, version) that has batches not yet written online."""
    # Platform maintenance across all workspaces: unscoped on purpose.
    waiting = (
        Batch.objects.unscoped()
        .filter(online_written=False, group__online=True)
        .exclude(group__status=Lifecycle.RETIRED)
        .values_list("group_id", "version")
        .distinct()
        .order_by("group_id", "version")
    )
    pairs = list(waiting)
    groups = {
        g.pk: g
        for g in FeatureGroup.objects.unscoped()
        .filter(pk__in={group_id for group_id, _ in pairs})
        .select_related("workspace")
    }
    return [
        group_materialize(group=groups[group_id], version=version, now=now)
        for group_id, version in pairs
    ]


def batch_materialize_event(event: Event) -> None:
    """The ``features.online`` consumer's handler for one ``feature_batch.ingested`` event: write
    the batch's rows online unless the push already did, then mark it written. Raises when the
    online store cannot be written, so the consumer tries the event again."""
    batch_id = next(
        (int(r.object_id) for r in event.refs.all() if r.kind == "batch" and r.object_id.isdigit()),
        None,
    )
    if batch_id is None or event.workspace_id is None:
        return
    batch = (
        Batch.objects.for_workspace(event.workspace_id)
        .filter(pk=batch_id, online_written=False, group__online=True)
        .exclude(group__status=Lifecycle.RETIRED)
        .select_related("group", "group__workspace")
        .first()
    )
    if batch is None:
        return  # written by the push (or the group is offline only, or retired)
    group = batch.group
    spec = (
        FeatureGroupVersion.objects.for_workspace(group.workspace_id)
        .filter(group=group, version=batch.version)
        .first()
    )
    if spec is None:
        return
    table = offline_store.read_batch(
        workspace_id=group.workspace_id,
        group_id=group.pk,
        version=batch.version,
        batch_id=batch.pk,
        columns=[
            *group.entity_keys,
            group.event_time_column,
            *[s["name"] for s in spec.features],
        ],
    )
    if table is not None and table.num_rows:
        write_online(group=group, version=batch.version, table=table)
    Batch.objects.for_workspace(group.workspace_id).filter(pk=batch.pk).update(online_written=True)
