"""Reads of record sets, always narrowed to one workspace."""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq
from django.db.models import Count, QuerySet

from curation.models import (
    Annotation,
    AnnotationItem,
    AnnotationTask,
    ItemStatus,
    RecordSet,
    RecordSetStatus,
)
from curation.services import record_set_file
from workspaces.exceptions import ReferenceNotFound
from workspaces.models import Workspace

PREVIEW_ROWS = 20


def record_sets_of(*, workspace: Workspace | int) -> QuerySet:
    return (
        RecordSet.objects.for_workspace(workspace)
        .select_related("created_by", "parent")
        .order_by("name", "-version")
    )


def record_set_get(
    *, workspace: Workspace | int, name: str, version: int | None = None, attr: str = "source"
) -> RecordSet:
    """A version of a record set (the latest when ``version`` is None); 404 naming ``attr``."""
    found = record_sets_of(workspace=workspace).filter(name=name)
    found = found.filter(version=version) if version is not None else found
    record_set = found.order_by("-version").first()
    if record_set is None:
        shown = f"{name} v{version}" if version is not None else name
        raise ReferenceNotFound(f"no record set '{shown}'", attr=attr)
    return record_set


def record_set_rows(record_set: RecordSet, *, limit: int = PREVIEW_ROWS) -> list[dict[str, Any]]:
    """The first rows of a ready record set, as JSON-able dicts."""
    if record_set.status != RecordSetStatus.READY or limit <= 0:
        return []
    reader = pq.ParquetFile(record_set_file(record_set))
    rows: list[dict[str, Any]] = []
    for batch in reader.iter_batches(batch_size=min(limit, 1000)):
        rows.extend(batch.to_pylist())
        if len(rows) >= limit:
            break
    return rows[:limit]


def annotation_tasks_of(*, workspace: Workspace | int) -> QuerySet:
    return (
        AnnotationTask.objects.for_workspace(workspace)
        .select_related("source", "created_by")
        .prefetch_related("annotators", "reviewers")
        .order_by("name")
    )


def items_of(*, task: AnnotationTask) -> QuerySet:
    return (
        AnnotationItem.objects.for_workspace(task.workspace_id)
        .filter(task=task)
        .order_by("position")
    )


def task_progress(task: AnnotationTask) -> dict[str, Any]:
    """Items by status, labels given of labels wanted, and labels per annotator."""
    by_status = dict(items_of(task=task).order_by().values_list("status").annotate(n=Count("pk")))
    per_annotator = dict(
        Annotation.objects.for_workspace(task.workspace_id)
        .filter(item__task=task)
        .order_by()
        .values_list("annotator__username")
        .annotate(n=Count("pk"))
    )
    labels = sum(per_annotator.values())
    return {
        "items": task.item_count,
        "by_status": {s: by_status.get(s, 0) for s in ItemStatus.values},
        "settled": by_status.get(ItemStatus.AGREED, 0) + by_status.get(ItemStatus.RESOLVED, 0),
        "labels": labels,
        "labels_wanted": task.item_count * task.annotators_per_item,
        "per_annotator": dict(sorted(per_annotator.items())),
    }
