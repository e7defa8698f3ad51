"""Writes of record sets: upload one, build one with a data-building pipeline (``stages``).

A record set's file lands at ``ARTIFACT_ROOT/recordsets/ws=<id>/<name>/v=<version>/records.parquet``
(written under a temporary name, then renamed). A pipeline run creates the output version
``building`` in the request and a worker (``curation.tasks.pipeline_build``) runs the stages
after the commit, recording each stage's report as it finishes; its events
(``record_set.created`` with the source as input, then ``record_set.built``) put the source
upstream of the output in the lineage graph.
"""

from __future__ import annotations

import io
import logging
import os
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from curation import annotation
from curation import stages as stage_kinds
from curation.models import (
    Annotation,
    AnnotationItem,
    AnnotationTask,
    AnnotationTaskStatus,
    ItemStatus,
    RecordSet,
    RecordSetSource,
    RecordSetStatus,
    name_validator,
)
from workspaces.events import Actor, Ref, actor_user, event_record
from workspaces.exceptions import ConflictError
from workspaces.models import Workspace

logger = logging.getLogger(__name__)

ROOT = "recordsets"
FILE = "records.parquet"
MAX_COLUMNS = 200
MAX_ERROR_CHARS = 2000
UPLOAD_FORMATS = ("jsonl", "parquet", "csv")


def record_set_file(record_set: RecordSet) -> Path:
    return Path(settings.ARTIFACT_ROOT) / record_set.path


def _relative_path(workspace_id: int, name: str, version: int) -> str:
    return f"{ROOT}/ws={workspace_id}/{name}/v={version}/{FILE}"


def _write(table: pa.Table, final: Path) -> int:
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.parent / f".{final.name}-{uuid.uuid4().hex}.tmp"
    try:
        pq.write_table(table, temporary, compression="zstd")
        os.replace(temporary, final)
    finally:
        temporary.unlink(missing_ok=True)
    return final.stat().st_size


def _columns(schema: pa.Schema) -> list[dict[str, str]]:
    return [{"name": f.name, "type": str(f.type)} for f in schema]


def ranking_features(record_set: RecordSet) -> list[tuple[str, str]]:
    """A ranking sample's features (a record set formatted ``to: ranking``): (column, dtype:
    ``float``, ``bool`` or ``categorical``) for each column but the label and the time;
    ``ValueError`` naming what the record set lacks."""
    schema = pq.read_schema(record_set_file(record_set))
    if stage_kinds.RANKING_LABEL not in schema.names or not pa.types.is_integer(
        schema.field(stage_kinds.RANKING_LABEL).type
    ):
        raise ValueError(
            f"has no 0/1 {stage_kinds.RANKING_LABEL} column: a pipeline's format stage with "
            "to: ranking makes one"
        )
    out = []
    for column in schema:
        if column.name in (stage_kinds.RANKING_LABEL, stage_kinds.RANKING_TIME):
            continue
        kind = stage_kinds.feature_kind(column.type)
        if kind is None:
            raise ValueError(f"column {column.name!r} is {column.type}, not a ranking feature")
        out.append((column.name, kind))
    if not out:
        raise ValueError("has no feature columns besides its label")
    return out


def _check_name(name: str) -> None:
    try:
        name_validator(name)
    except ValidationError as exc:
        raise ValidationError({"name": exc.messages}) from exc


def _next_version(workspace: Workspace, name: str) -> int:
    latest = (
        RecordSet.objects.for_workspace(workspace)
        .filter(name=name)
        .aggregate(latest=Max("version"))["latest"]
    )
    return (latest or 0) + 1


def parse_upload(content: bytes, fmt: str) -> pa.Table:
    """The uploaded records as a table: JSON Lines (one object per line), Parquet or CSV with a
    header; a file that does not parse is refused naming ``file``."""
    if fmt not in UPLOAD_FORMATS:
        raise ValidationError(
            {"format": f"unknown format {fmt!r}; allowed: {', '.join(UPLOAD_FORMATS)}"}
        )
    try:
        if fmt == "jsonl":
            table = pa_json.read_json(io.BytesIO(content))
        elif fmt == "parquet":
            table = pq.read_table(io.BytesIO(content))
        else:
            table = pa_csv.read_csv(io.BytesIO(content))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise ValidationError({"file": f"this is not a {fmt} file of records: {exc}"}) from exc
    if not table.num_columns:
        raise ValidationError({"file": "the file has no columns"})
    if table.num_columns > MAX_COLUMNS:
        raise ValidationError({"file": f"at most {MAX_COLUMNS} columns, not {table.num_columns}"})
    if len(set(table.column_names)) != table.num_columns:
        raise ValidationError({"file": "two columns have the same name"})
    return table


def format_of(filename: str) -> str:
    """The upload format a file name implies (``.jsonl``/``.json``/``.ndjson``, ``.parquet``,
    ``.csv``); JSON Lines when it implies none."""
    suffix = Path(filename or "").suffix.lower()
    return {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}.get(suffix, "jsonl")


def _create_once(model: Any, conflict: str, **fields: Any) -> Any:
    """A new row, or 409 naming ``name`` when another was made with the same name (and version)
    at the same time (the unique constraint, in a savepoint that the caller's transaction
    survives)."""
    try:
        with transaction.atomic():
            return model.objects.create(**fields)
    except IntegrityError as exc:
        raise ConflictError(conflict, attr="name") from exc


def _store_ready(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    table: pa.Table,
    origin: str,
    parent: RecordSet | None,
    verb: str,
    inputs: list[Any],
    payload: dict[str, Any],
) -> RecordSet:
    """Write ``table`` as the next version of ``name``, ready at once, with its event (the
    ``inputs`` as its lineage); one transaction."""
    with transaction.atomic():
        version = _next_version(workspace, name)
        path = _relative_path(workspace.pk, name, version)
        written = _write(table, Path(settings.ARTIFACT_ROOT) / path)
        record_set = _create_once(
            RecordSet,
            f"'{name}' v{version} was created at the same time; try again",
            workspace=workspace,
            name=name,
            version=version,
            source=origin,
            parent=parent,
            status=RecordSetStatus.READY,
            path=path,
            columns=_columns(table.schema),
            row_count=table.num_rows,
            bytes=written,
            created_by=actor_user(actor),
            built_at=timezone.now(),
        )
        event_record(
            actor=actor,
            workspace=workspace,
            verb=verb,
            refs=[Ref.to(record_set), *(Ref.to(i, role="input") for i in inputs)],
            resources={"rows": table.num_rows, "bytes": written},
            payload={"name": name, "version": version, "rows": table.num_rows, **payload},
        )
    return record_set


def record_set_upload(
    *, actor: Actor, workspace: Workspace, name: str, content: bytes, fmt: str
) -> RecordSet:
    """A new version of ``name`` holding the uploaded records (ready at once)."""
    _check_name(name)
    table = parse_upload(content, fmt)
    return _store_ready(
        actor=actor,
        workspace=workspace,
        name=name,
        table=table,
        origin=RecordSetSource.UPLOAD,
        parent=None,
        verb="record_set.uploaded",
        inputs=[],
        payload={"format": fmt},
    )


def pipeline_run(
    *,
    actor: Actor,
    workspace: Workspace,
    source: RecordSet,
    name: str,
    stages: Any,
    background: bool = True,
) -> RecordSet:
    """Validate ``stages`` against the source's columns and create the output version of
    ``name`` ``building``; the build runs after the commit (on a worker with ``background``)."""
    _check_name(name)
    if source.status != RecordSetStatus.READY:
        raise ConflictError(f"'{source}' is {source.status}, not ready", attr="source")
    try:
        checked = stage_kinds.validate(stages, pq.read_schema(record_set_file(source)))
    except stage_kinds.StageError as exc:
        raise ValidationError({exc.path: exc.message}) from exc
    with transaction.atomic():
        version = _next_version(workspace, name)
        output = _create_once(
            RecordSet,
            f"'{name}' v{version} was created at the same time; run again",
            workspace=workspace,
            name=name,
            version=version,
            source=RecordSetSource.PIPELINE,
            parent=source,
            stages=checked,
            path=_relative_path(workspace.pk, name, version),
            created_by=actor_user(actor),
        )
        event_record(
            actor=actor,
            workspace=workspace,
            verb="record_set.created",
            refs=[Ref.to(output), Ref.to(source, role="input")],
            payload={
                "name": name,
                "version": version,
                "source": str(source),
                "stages": [s["kind"] for s in checked],
            },
        )
        if background:
            transaction.on_commit(partial(_enqueue, output.pk))
    if not background:
        return pipeline_build(output.pk) or output
    return output


def _enqueue(record_set_id: int) -> None:
    from curation.tasks import pipeline_build_task

    try:
        pipeline_build_task.apply_async(args=[record_set_id])
    except Exception as exc:  # the broker is down or refuses the message
        logger.warning("could not queue record set %s", record_set_id, exc_info=True)
        _finish(
            record_set_id,
            error=f"the build could not be queued ({type(exc).__name__}); run it again",
        )


def _lock(record_set_id: int) -> RecordSet | None:
    # Builds run from the platform's own ids (a task), never from a request.
    return (
        RecordSet.objects.unscoped()
        .select_for_update(of=("self",))
        .select_related("workspace", "parent", "created_by")
        .filter(pk=record_set_id)
        .first()
    )


def _record_stage(record_set_id: int, reports: list[dict[str, Any]]) -> None:
    RecordSet.objects.unscoped().filter(pk=record_set_id, status=RecordSetStatus.BUILDING).update(
        reports=reports, stages_done=len(reports)
    )


def pipeline_build(record_set_id: int) -> RecordSet | None:
    """Run a ``building`` record set's stages over its source and write it; safe to repeat (a
    record set no longer building is left as it is)."""
    with transaction.atomic():
        record_set = _lock(record_set_id)
        if record_set is None or record_set.status != RecordSetStatus.BUILDING:
            return record_set
    assert record_set.parent is not None
    reports: list[dict[str, Any]] = []

    def on_stage(_index: int, report: stage_kinds.StageReport) -> None:
        reports.append(report.as_dict())
        _record_stage(record_set_id, reports)

    try:
        table = pq.read_table(record_set_file(record_set.parent))
        table, _ = stage_kinds.run(table, record_set.stages, on_stage=on_stage)
        written = _write(table, record_set_file(record_set))
    except Exception as exc:  # any failure is recorded on the record set
        logger.warning("record set %s failed to build", record_set_id, exc_info=True)
        text = f"{type(exc).__name__}: {exc}".replace(str(settings.ARTIFACT_ROOT), "<artifacts>")
        return _finish(record_set_id, error=text[:MAX_ERROR_CHARS], reports=reports)
    return _finish(record_set_id, table=table, written=written, reports=reports)


@transaction.atomic
def _finish(
    record_set_id: int,
    *,
    error: str = "",
    table: pa.Table | None = None,
    written: int = 0,
    reports: list[dict[str, Any]] | None = None,
) -> RecordSet | None:
    record_set = _lock(record_set_id)
    if record_set is None or record_set.status != RecordSetStatus.BUILDING:
        return record_set
    record_set.reports = reports if reports is not None else record_set.reports
    record_set.stages_done = len(record_set.reports)
    record_set.built_at = timezone.now()
    refs = [Ref.to(record_set, role="output")]
    if record_set.parent is not None:
        refs.append(Ref.to(record_set.parent, role="input"))
    if table is None:
        record_set.status = RecordSetStatus.FAILED
        record_set.error = error
        record_set.save(update_fields=["status", "error", "reports", "stages_done", "built_at"])
        event_record(
            actor=record_set.created_by,
            workspace=record_set.workspace,
            verb="record_set.failed",
            refs=refs,
            payload={"name": record_set.name, "version": record_set.version, "error": error},
        )
        return record_set
    record_set.status = RecordSetStatus.READY
    record_set.row_count = table.num_rows
    record_set.columns = _columns(table.schema)
    record_set.bytes = written
    record_set.save(
        update_fields=[
            "status",
            "row_count",
            "columns",
            "bytes",
            "reports",
            "stages_done",
            "built_at",
        ]
    )
    event_record(
        actor=record_set.created_by,
        workspace=record_set.workspace,
        verb="record_set.built",
        refs=refs,
        resources={"rows": table.num_rows, "bytes": written},
        payload={
            "name": record_set.name,
            "version": record_set.version,
            "rows": table.num_rows,
            "rows_in": record_set.reports[0]["rows_in"] if record_set.reports else table.num_rows,
            "stages": [
                {"kind": r["kind"], "rows_in": r["rows_in"], "rows_out": r["rows_out"]}
                for r in record_set.reports
            ],
        },
    )
    return record_set


# --- annotation tasks -------------------------------------------------------------------------

MAX_ITEMS = 5000


def _members(workspace: Workspace, usernames: list[str], attr: str) -> list[Any]:
    from workspaces.models import Membership

    found = {
        m.user.username: m.user
        for m in Membership.objects.for_workspace(workspace)
        .filter(user__username__in=usernames)
        .select_related("user")
    }
    missing = [u for u in usernames if u not in found]
    if missing:
        raise ValidationError({attr: f"not members of this workspace: {', '.join(missing)}"})
    return [found[u] for u in usernames]


def annotation_task_create(
    *,
    actor: Actor,
    workspace: Workspace,
    name: str,
    source: RecordSet,
    text_field: str,
    schema: Any,
    annotators_per_item: int = 2,
    annotators: list[str] | None = None,
    reviewers: list[str] | None = None,
    instructions: str = "",
) -> AnnotationTask:
    """A task over every row of ``source`` (at most ``MAX_ITEMS``), labelled against ``schema``."""
    _check_name(name)
    if source.status != RecordSetStatus.READY:
        raise ConflictError(f"'{source}' is {source.status}, not ready", attr="record_set")
    columns = [c["name"] for c in source.columns]
    if text_field not in columns:
        raise ValidationError(
            {"text_field": f"'{text_field}' is not a column; the columns are {', '.join(columns)}"}
        )
    if source.row_count > MAX_ITEMS:
        raise ValidationError(
            {
                "record_set": f"'{source}' has {source.row_count} rows; "
                f"a task takes at most {MAX_ITEMS}"
            }
        )
    if not 1 <= annotators_per_item <= 10:
        raise ValidationError({"annotators_per_item": "must be from 1 to 10"})
    try:
        checked = annotation.validate_schema(schema)
    except annotation.SchemaError as exc:
        raise ValidationError({exc.path: exc.message}) from exc
    people = _members(workspace, list(dict.fromkeys(annotators or [])), "annotators")
    judges = _members(workspace, list(dict.fromkeys(reviewers or [])), "reviewers")
    if people and len(people) < annotators_per_item:
        raise ValidationError(
            {
                "annotators": f"{len(people)} annotators cannot give each item "
                f"{annotators_per_item} labels"
            }
        )
    rows = pq.read_table(record_set_file(source)).to_pylist()
    with transaction.atomic():
        task = _create_once(
            AnnotationTask,
            f"a task named '{name}' exists",
            workspace=workspace,
            name=name,
            source=source,
            text_field=text_field,
            schema=checked,
            instructions=instructions[:5000],
            annotators_per_item=annotators_per_item,
            item_count=len(rows),
            created_by=actor_user(actor),
        )
        task.annotators.set(people)
        task.reviewers.set(judges)
        AnnotationItem.objects.bulk_create(
            [
                AnnotationItem(workspace=workspace, task=task, position=i, data=_jsonable(row))
                for i, row in enumerate(rows)
            ],
            batch_size=1000,
        )
        event_record(
            actor=actor,
            workspace=workspace,
            verb="annotation_task.created",
            refs=[Ref.to(task), Ref.to(source, role="input")],
            payload={"name": name, "items": len(rows), "k": annotators_per_item},
        )
    return task


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    import json

    return json.loads(json.dumps(row, default=str))


def may_annotate(task: AnnotationTask, user: Any, role: str | None) -> bool:
    from workspaces.selectors import role_at_least

    listed = list(task.annotators.values_list("pk", flat=True))
    if listed:
        return user.pk in listed
    return role_at_least(role, "developer")


def may_review(task: AnnotationTask, user: Any, role: str | None) -> bool:
    from workspaces.selectors import role_at_least

    listed = list(task.reviewers.values_list("pk", flat=True))
    if listed:
        return user.pk in listed or role_at_least(role, "admin")
    return role_at_least(role, "maintainer")


def next_item(task: AnnotationTask, user: Any) -> AnnotationItem | None:
    """The next item for ``user``: one still short of labels that they have not labelled, the
    fullest first (items finish sooner), then in the source's order."""
    return (
        AnnotationItem.objects.for_workspace(task.workspace_id)
        .filter(task=task, status=ItemStatus.OPEN, label_count__lt=task.annotators_per_item)
        .exclude(labels__annotator=user)
        .order_by("-label_count", "position")
        .first()
    )


def _text_length(task: AnnotationTask, item: AnnotationItem) -> int:
    return len(str(item.data.get(task.text_field) or ""))


def _checked_values(task: AnnotationTask, item: AnnotationItem, values: Any) -> dict[str, Any]:
    try:
        return annotation.validate_values(task.schema, values, text_length=_text_length(task, item))
    except annotation.SchemaError as exc:
        raise ValidationError({exc.path: exc.message}) from exc


def _locked(task: AnnotationTask, item: AnnotationItem) -> AnnotationItem:
    """The item, read again under a row lock (inside the caller's transaction)."""
    return (
        AnnotationItem.objects.for_workspace(task.workspace_id).select_for_update().get(pk=item.pk)
    )


def annotation_submit(
    *, actor: Any, task: AnnotationTask, item: AnnotationItem, values: Any, role: str | None
) -> AnnotationItem:
    """``actor``'s labels of ``item``: 403 when they do not annotate this task, 409 when they
    labelled it already or it has its labels; the last label settles the item (agreed, or
    disputed for a reviewer)."""
    if task.status != AnnotationTaskStatus.OPEN:
        raise ConflictError(f"the task is {task.status}", attr="status")
    if not may_annotate(task, actor, role):
        raise PermissionDenied("you are not an annotator of this task")
    checked = _checked_values(task, item, values)
    with transaction.atomic():
        locked = _locked(task, item)
        if (
            Annotation.objects.for_workspace(task.workspace_id)
            .filter(item=locked, annotator=actor)
            .exists()
        ):
            raise ConflictError("you labelled this item already", attr="item")
        if locked.label_count >= task.annotators_per_item or locked.status != ItemStatus.OPEN:
            raise ConflictError(
                f"this item has its {task.annotators_per_item} labels; take the next one",
                attr="item",
            )
        Annotation.objects.create(
            workspace_id=task.workspace_id, item=locked, annotator=actor, values=checked
        )
        locked.label_count += 1
        if locked.label_count >= task.annotators_per_item:
            labels = list(
                Annotation.objects.for_workspace(task.workspace_id)
                .filter(item=locked)
                .values_list("values", flat=True)
            )
            final = annotation.agreed_values(task.schema, labels)
            locked.status = ItemStatus.AGREED if final is not None else ItemStatus.DISPUTED
            locked.final = final
        locked.save(update_fields=["label_count", "status", "final"])
        event_record(
            actor=actor,
            workspace=task.workspace,
            verb="annotation.labelled",
            refs=[Ref.to(task)],
            payload={"item": locked.position, "status": locked.status},
        )
    return locked


def annotation_adjudicate(
    *, actor: Any, task: AnnotationTask, item: AnnotationItem, values: Any, role: str | None
) -> AnnotationItem:
    """A reviewer's final values for a disputed item."""
    if not may_review(task, actor, role):
        raise PermissionDenied("you are not a reviewer of this task")
    checked = _checked_values(task, item, values)
    with transaction.atomic():
        locked = _locked(task, item)
        if locked.status != ItemStatus.DISPUTED:
            raise ConflictError(f"the item is {locked.status}, not disputed", attr="item")
        locked.final, locked.status, locked.resolved_by = checked, ItemStatus.RESOLVED, actor
        locked.save(update_fields=["final", "status", "resolved_by"])
        event_record(
            actor=actor,
            workspace=task.workspace,
            verb="annotation.adjudicated",
            refs=[Ref.to(task)],
            payload={"item": locked.position},
        )
    return locked


def _field_type(field: dict[str, Any]) -> pa.DataType:
    return {
        "choice": pa.string(),
        "multi_choice": pa.list_(pa.string()),
        "rating": pa.int64(),
        "text": pa.string(),
        "spans": pa.list_(
            pa.struct([("start", pa.int64()), ("end", pa.int64()), ("label", pa.string())])
        ),
    }[field["kind"]]


def annotation_export(*, actor: Actor, task: AnnotationTask, name: str) -> RecordSet:
    """The settled items (agreed or adjudicated) as the next version of record set ``name``:
    the source's columns, then one column per schema field holding the final values."""
    _check_name(name)
    settled = list(
        AnnotationItem.objects.for_workspace(task.workspace_id)
        .filter(task=task, status__in=[ItemStatus.AGREED, ItemStatus.RESOLVED])
        .order_by("position")
    )
    if not settled:
        raise ConflictError("no item is settled yet (agreed or adjudicated)", attr="items")
    source_rows = pq.read_table(record_set_file(task.source))
    table = source_rows.take(pa.array([i.position for i in settled], pa.int64()))
    for field in task.schema["fields"]:
        column = f"label_{field['name']}" if field["name"] in table.column_names else field["name"]
        values = [(i.final or {}).get(field["name"]) for i in settled]
        table = table.append_column(column, pa.array(values, _field_type(field)))
    return _store_ready(
        actor=actor,
        workspace=task.workspace,
        name=name,
        table=table,
        origin=RecordSetSource.ANNOTATION,
        parent=task.source,
        verb="record_set.exported",
        inputs=[task.source, task],
        payload={"task": task.name},
    )


def annotation_agreement(task: AnnotationTask) -> dict[str, Any]:
    labels = [
        (a.item.position, a.annotator.username, a.values)
        for a in Annotation.objects.for_workspace(task.workspace_id)
        .filter(item__task=task)
        .select_related("item", "annotator")
    ]
    finals = {
        i.position: i.final
        for i in AnnotationItem.objects.for_workspace(task.workspace_id).filter(
            task=task, final__isnull=False
        )
    }
    return annotation.agreement(task.schema, labels, finals, k=task.annotators_per_item)
